"""MRPC as Hugging Face `datasets` left it on disk, read with pyarrow (no `datasets` install needed).

`data.mrpc_hf` takes a folder, or `cache` for the default caches. Where MRPC can be:
- the datasets cache (`$HF_DATASETS_CACHE`, default `~/.cache/huggingface/datasets`), after
  `load_dataset("glue", "mrpc")` or `load_dataset("nyu-mll/glue", "mrpc")`:
  `glue/mrpc/<version>/<hash>/glue-train.arrow` + `glue-validation.arrow` (older script builds, version 1.0.0)
  or `nyu-mll___glue/mrpc/0.0.0/<hash>/...` (builds from the Hub's Parquet); big splits are sharded as
  `glue-train-00000-of-00003.arrow`. These are Arrow IPC streams.
- the Hub cache (`$HF_HUB_CACHE`, default `~/.cache/huggingface/hub`), the Parquet those builds start from:
  `datasets--nyu-mll--glue/snapshots/<revision>/mrpc/train-00000-of-00001.parquet` + `validation-...`.
- a `DatasetDict.save_to_disk(DIR)` folder: `dataset_dict.json` ({"splits": [...]}) and one folder per split
  holding `data-00000-of-00001.arrow` (listed in its `state.json`); or `train/` and `validation/` folders
  each written by `Dataset.save_to_disk`.
Any folder on the way down works (`.../glue`, `.../glue/mrpc`, a hash folder, a snapshot): the layouts
below it are tried in that order, newest hash folder first, as `datasets` picks it. Columns:
sentence1, sentence2, label (1 = equivalent, MRPC's "paraphrase"), idx. Train is `train`, eval is
`validation` (the test split's labels are -1).
"""

from __future__ import annotations

import glob
import json
import os
import re
from dataclasses import dataclass

import torch

from zero_core import ConfigError

from .arrow_io import read_columns, read_schema_names
from .mrpc import Pair, encode_pairs
from .tokenize import Tokenizer

KEY = "data.mrpc_hf"
COLUMNS = ("sentence1", "sentence2", "label")
SPLITS = ("train", "validation")
# below a given folder, where MRPC's split folder may sit (first match wins)
BELOW = ("", "mrpc", "*/*", "mrpc/*/*", "glue/mrpc/*/*", "nyu-mll___glue/mrpc/*/*", "snapshots/*/mrpc",
         "datasets--nyu-mll--glue/snapshots/*/mrpc", "datasets--glue/snapshots/*/mrpc",
         "datasets/glue/mrpc/*/*", "datasets/nyu-mll___glue/mrpc/*/*",
         "hub/datasets--nyu-mll--glue/snapshots/*/mrpc", "hub/datasets--glue/snapshots/*/mrpc")
LAYOUTS = ("dataset_dict.json + <split>/data-*.arrow (save_to_disk), glue-train.arrow + glue-validation.arrow "
           "(datasets cache), train-*.parquet + validation-*.parquet (Hub snapshot)")
_BUILDER = re.compile(r"^(?P<name>.+)-(?P<split>train|validation)(-\d{5}-of-\d{5})?\.arrow$")
_PARQUET = re.compile(r"^(?P<split>train|validation)(-\d{5}-of-\d{5})?\.parquet$")


@dataclass(frozen=True)
class MrpcHfFiles:
    folder: str
    train: list[str]
    eval: list[str]


def resolve(where: str, base_dir: str) -> str:
    """`cache` as is; a path relative to the scenario's folder made absolute."""
    return where if where == "cache" else os.path.normpath(os.path.join(base_dir, os.path.expanduser(where)))


def cache_roots() -> list[str]:
    """The datasets cache and the Hub cache, as `datasets` and `huggingface_hub` resolve them."""
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface")
    hub = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")
    return [os.path.expanduser(os.environ.get("HF_DATASETS_CACHE") or os.path.join(home, "datasets")),
            os.path.expanduser(hub)]


def _saved_split(folder: str) -> list[str]:
    """The Arrow files of one `Dataset.save_to_disk` folder (state.json's list, else data-*.arrow)."""
    state = os.path.join(folder, "state.json")
    if os.path.isfile(state):
        try:
            with open(state, encoding="utf-8") as f:
                names = [d["filename"] for d in json.load(f).get("_data_files", [])]
            return [os.path.join(folder, n) for n in names]
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ConfigError(f"{KEY}: {state} is not a datasets state.json; save the dataset again") from None
    return sorted(glob.glob(os.path.join(folder, "data-*.arrow")))


def split_files(folder: str) -> dict[str, list[str]] | None:
    """{'train': [...], 'validation': [...]} of the first layout `folder` holds, or None."""
    found: dict[str, list[str]] = {}
    if os.path.isfile(os.path.join(folder, "dataset_dict.json")) or all(
            os.path.isdir(os.path.join(folder, s)) for s in SPLITS):
        found = {s: _saved_split(os.path.join(folder, s)) for s in SPLITS if os.path.isdir(os.path.join(folder, s))}
    if not all(found.get(s) for s in SPLITS):
        names = sorted(os.listdir(folder))
        builders: dict[tuple[str, str], list[str]] = {}
        for n in names:
            m = _BUILDER.match(n)
            if m and not n.startswith("cache-"):  # cache-*.arrow are map() outputs, not the splits
                builders.setdefault((m["name"], m["split"]), []).append(os.path.join(folder, n))
        for name in dict.fromkeys(k[0] for k in builders):
            if all((name, s) in builders for s in SPLITS):
                found = {s: builders[(name, s)] for s in SPLITS}
                break
        else:
            found = {s: [os.path.join(folder, n) for n in names if (m := _PARQUET.match(n)) and m["split"] == s]
                     for s in SPLITS}
    return found if all(found.get(s) for s in SPLITS) else None


def _candidates(root: str) -> list[str]:
    out: list[str] = []
    for pattern in BELOW:
        hits = [root] if not pattern else [p for p in glob.glob(os.path.join(glob.escape(root), pattern))
                                           if os.path.isdir(p) and ".incomplete" not in p]
        out += sorted(hits, key=os.path.getmtime, reverse=True)  # the newest hash folder first
    return list(dict.fromkeys(out))


def find_mrpc_hf(where: str) -> MrpcHfFiles:
    """MRPC's train and validation files under `where` (a folder, or 'cache'); one-line errors otherwise."""
    roots = cache_roots() if where == "cache" else [where]
    if where != "cache" and not os.path.isdir(where):
        raise ConfigError(f"{KEY}: {where} is not a folder; point it at a datasets cache, a Hub snapshot or a "
                          "save_to_disk folder holding MRPC (or write `cache` for the default caches)")
    for root in (r for r in roots if os.path.isdir(r)):
        for folder in _candidates(root):
            files = split_files(folder)
            if files:
                mrpc = MrpcHfFiles(folder, files["train"], files["validation"])
                check_columns(mrpc)
                return mrpc
    raise ConfigError(f"{KEY}: no MRPC train + validation split files under {' or '.join(roots)} (looked for "
                      f"{LAYOUTS}, there and in glue/mrpc/<version>/<hash>, nyu-mll___glue/mrpc/<version>/<hash>, "
                      "datasets--nyu-mll--glue/snapshots/<revision>/mrpc); run load_dataset('nyu-mll/glue', 'mrpc') "
                      "or point it at the folder")


def check_columns(files: MrpcHfFiles) -> None:
    for path in files.train + files.eval:
        if not os.path.isfile(path):
            raise ConfigError(f"{KEY}: {path} is missing (listed by the dataset folder); save the dataset again")
        names = read_schema_names(path, KEY)
        if not all(c in names for c in COLUMNS):
            raise ConfigError(f"{KEY}: {path} has columns {', '.join(names) or 'none'}; MRPC needs "
                              f"{', '.join(COLUMNS)} (is it another GLUE task?)")


def read_split(paths: list[str]) -> list[Pair]:
    pairs = []
    for path in paths:
        cols = read_columns(path, list(COLUMNS), KEY)
        for a, b, label in zip(cols["sentence1"], cols["sentence2"], cols["label"]):
            if label not in (0, 1):
                raise ConfigError(f"{KEY}: {path} has label {label!r}; MRPC labels are 0 or 1 (the test split's -1 "
                                  "means unlabelled: use train and validation)")
            pairs.append(Pair(int(label), a, b))
    return pairs


def load_mrpc_hf(where: str, tok: Tokenizer, seq_len: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(train, eval) tensors of MRPC's train and validation splits found under `where`."""
    files = find_mrpc_hf(where)
    return encode_pairs(read_split(files.train), tok, seq_len), encode_pairs(read_split(files.eval), tok, seq_len)
