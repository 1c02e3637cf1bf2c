"""Make `zbench convert --to fp32|bf16|fp16` output a folder `AutoModel*.from_pretrained(out)` opens.

A checkpoint written by Hugging Face Trainer sits in an HF layout: `checkpoint-N/` holds (or its parent holds)
`config.json`, `generation_config.json` and the tokenizer files. `hf_files` finds those to copy, by a fixed list of
plain names, regular files only (links with --follow-symlinks), in the first of SRC and its parent that has a
`config.json`, before anything is written; `--hf-config PATH` supplies the config otherwise (or instead).
`tie_index` makes a sharded index follow save_pretrained's convention: a tied name is stored once and the index
lists only the names each shard holds (never a name its shard lacks).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from safetensors import safe_open

from .paths import inside, read_regular
from .source import CheckpointError

HF_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt", "vocab.txt",
            "tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "chat_template.jinja",
            "preprocessor_config.json")
INDEX = "model.safetensors.index.json"


def hf_layout(src: str | Path, follow_symlinks: bool = False) -> Path | None:
    """The folder holding the HF files for checkpoint SRC: SRC itself or its parent, whichever has config.json
    (a link to one counts with `follow_symlinks`: Hugging Face's cache links every file)."""
    for folder in (Path(src), Path(src).parent):
        if os.path.lexists(folder / "config.json"):  # a link is refused here unless followed, as every HF file
            if inside(folder, "config.json", what="Hugging Face file", follow_symlinks=follow_symlinks).is_file():
                return folder
    return None


def hf_files(src: str | Path, hf_config: str | Path | None = None,
             follow_symlinks: bool = False) -> list[tuple[Path, str]]:
    """(file, its name in OUT) of each HF file to copy for SRC (and `hf_config` as config.json), found and
    checked before anything is written: a link is refused unless `follow_symlinks`."""
    found = []
    folder = hf_layout(src, follow_symlinks)
    if folder is not None:
        for name in HF_FILES:
            path = inside(folder, name, what="Hugging Face file", follow_symlinks=follow_symlinks)
            if path.is_file():
                found.append((path, name))
    if hf_config is not None:
        found = [(p, n) for p, n in found if n != "config.json"] + [(check_hf_config(hf_config), "config.json")]
    return found


def copy_hf_files(files: list[tuple[Path, str]], out: str | Path, copied: list[str]) -> None:
    """Copy `hf_files`' answer into OUT, each name added to `copied` as its copy begins (what to take back if
    one fails)."""
    for path, name in files:
        copied.append(name)
        shutil.copyfile(path, Path(out) / name)


MAX_HF_CONFIG_BYTES = 16 << 20  # a config.json is kilobytes


def check_hf_config(hf_config: str | Path) -> Path:
    """`--hf-config`, checked before anything is written: a readable JSON object."""
    config = Path(hf_config)
    try:
        raw = read_regular(config, MAX_HF_CONFIG_BYTES)  # never a FIFO or /dev/zero read without end
        if len(raw) > MAX_HF_CONFIG_BYTES:
            raise ValueError(f"larger than {MAX_HF_CONFIG_BYTES >> 20} MiB")
        if not isinstance(json.loads(raw.decode("utf-8")), dict):
            raise ValueError("not a JSON object")
    except RecursionError:
        raise CheckpointError(f"--hf-config {config}: nested too deeply for a config; pass a Hugging Face "
                              "config.json") from None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"--hf-config {config}: {e}; pass a Hugging Face config.json") from None
    return config


def tie_index(out: str | Path) -> None:
    """Rewrite OUT's sharded index so that every name it lists is in the shard it names (tied aliases,
    which the shards store once under their owner's name, are left out, as save_pretrained leaves them out)."""
    path = Path(out) / INDEX
    if not path.is_file():
        return
    index = json.loads(path.read_text(encoding="utf-8"))
    held: dict[str, set[str]] = {}
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(str(inside(out, shard, what="shard")), "pt") as f:
            held[shard] = set(f.keys())
    index["weight_map"] = {name: shard for name, shard in index["weight_map"].items() if name in held[shard]}
    path.write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
