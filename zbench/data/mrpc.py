"""MRPC (Microsoft Research Paraphrase Corpus) in its two public TSV layouts.

- GLUE: `train.tsv` and `dev.tsv` (the GLUE download / `glue_data/MRPC`)
- the original release: `msr_paraphrase_train.txt` and `msr_paraphrase_test.txt`
Both have the header `Quality  #1 ID  #2 ID  #1 String  #2 String` (tab-separated; Quality 1 means
"paraphrase"). Sentences contain quotes, so fields are split on tabs only, never unquoted.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from zero_core import ConfigError

from .tokenize import Tokenizer, pair_ids

LAYOUTS = (("train.tsv", "dev.tsv"), ("msr_paraphrase_train.txt", "msr_paraphrase_test.txt"))
COLUMNS = ("Quality", "#1 String", "#2 String")


@dataclass(frozen=True)
class Pair:
    label: int
    a: str
    b: str


def find_mrpc_files(folder: str) -> tuple[str, str]:
    """(train file, eval file) of the first layout present in `folder`."""
    if not os.path.isdir(folder):
        raise ConfigError(f"data.mrpc_tsv: {folder} is not a folder; point it at a GLUE MRPC folder "
                          "(train.tsv + dev.tsv, or msr_paraphrase_train.txt + msr_paraphrase_test.txt)")
    for train, dev in LAYOUTS:
        t, d = os.path.join(folder, train), os.path.join(folder, dev)
        if os.path.isfile(t) and os.path.isfile(d):
            return t, d
    raise ConfigError(f"data.mrpc_tsv: {folder} has neither train.tsv + dev.tsv nor msr_paraphrase_train.txt + "
                      "msr_paraphrase_test.txt; download GLUE MRPC into it")


def read_pairs(path: str) -> list[Pair]:
    """Every labelled row of one MRPC file."""
    with open(path, encoding="utf-8-sig") as f:  # the original release starts with a BOM
        lines = f.read().splitlines()
    if not lines:
        raise ConfigError(f"MRPC file {path} is empty")
    header = lines[0].split("\t")
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise ConfigError(f"MRPC file {path}: header lacks column '{missing[0]}'; expected "
                          "'Quality<TAB>#1 ID<TAB>#2 ID<TAB>#1 String<TAB>#2 String'")
    qi, ai, bi = (header.index(c) for c in COLUMNS)
    pairs = []
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        cells = line.split("\t")
        if len(cells) < len(header) or cells[qi] not in ("0", "1"):
            raise ConfigError(f"MRPC file {path} line {n}: expected {len(header)} tab-separated fields with "
                              f"Quality 0 or 1, got {line[:60]!r}")
        pairs.append(Pair(int(cells[qi]), cells[ai], cells[bi]))
    return pairs


def encode_pairs(pairs: list[Pair], tok: Tokenizer, seq_len: int) -> dict[str, torch.Tensor]:
    ids, masks = zip(*(pair_ids(tok, p.a, p.b, seq_len) for p in pairs)) if pairs else ((), ())
    return {
        "input_ids": torch.tensor(ids, dtype=torch.long).view(len(pairs), seq_len),
        "attention_mask": torch.tensor(masks, dtype=torch.long).view(len(pairs), seq_len),
        "labels": torch.tensor([p.label for p in pairs], dtype=torch.long),
    }


def load_mrpc(folder: str, tok: Tokenizer, seq_len: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(train, eval) tensors of the MRPC folder."""
    train, dev = find_mrpc_files(folder)
    return encode_pairs(read_pairs(train), tok, seq_len), encode_pairs(read_pairs(dev), tok, seq_len)
