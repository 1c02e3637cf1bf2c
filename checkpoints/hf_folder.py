"""Make `zbench convert --to fp32|bf16|fp16` output a folder `AutoModel*.from_pretrained(out)` opens.

A checkpoint written by Hugging Face Trainer sits in an HF layout: `checkpoint-N/` holds (or its parent holds)
`config.json`, `generation_config.json` and the tokenizer files. `copy_hf_files` copies those it finds, by a
fixed list of plain names, regular files only (no links), from the first of SRC and its parent that has a
`config.json`; `--hf-config PATH` supplies the config otherwise (or instead). `tie_index` makes a sharded
index follow save_pretrained's convention: a tied name is stored once and the index lists only the names
each shard holds (never a name its shard lacks).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from safetensors import safe_open

from .paths import inside
from .source import CheckpointError

HF_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt", "vocab.txt",
            "tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "chat_template.jinja",
            "preprocessor_config.json")
INDEX = "model.safetensors.index.json"


def hf_layout(src: str | Path) -> Path | None:
    """The folder holding the HF files for checkpoint SRC: SRC itself or its parent, whichever has config.json."""
    for folder in (Path(src), Path(src).parent):
        if (folder / "config.json").is_file() and not (folder / "config.json").is_symlink():
            return folder
    return None


def copy_hf_files(src: str | Path, out: str | Path, hf_config: str | Path | None = None) -> list[str]:
    """Copy the HF files beside SRC into OUT (and `hf_config` as OUT/config.json); the names copied."""
    out = Path(out)
    copied = []
    folder = hf_layout(src)
    if folder is not None:
        for name in HF_FILES:
            path = inside(folder, name, what="Hugging Face file")
            if path.is_file() and not (folder / name).is_symlink():
                shutil.copyfile(path, out / name)
                copied.append(name)
    if hf_config is not None:
        shutil.copyfile(check_hf_config(hf_config), out / "config.json")
        copied = sorted(set(copied) | {"config.json"})
    return copied


def check_hf_config(hf_config: str | Path) -> Path:
    """`--hf-config`, checked before anything is written: a readable JSON object."""
    config = Path(hf_config)
    try:
        if not isinstance(json.loads(config.read_text(encoding="utf-8")), dict):
            raise ValueError("not a JSON object")
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
