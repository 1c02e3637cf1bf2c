"""Source/target text pairs for seq2seq from local files: JSON lines, CSV, TSV, Parquet or Arrow.

    data:
      text_pairs: {train: mudoconv/train.jsonl, eval: mudoconv/validation.jsonl, source_prefix: "chatbot: "}

Columns default to the first of source/target, context/response (MuDoConv's names, e.g. exported with
`load_dataset("smangrul/MuDoConv")["train"].to_json("train.jsonl")`), input/output present in the file;
`source_column`/`target_column` name others. Without `eval`, the last `eval_fraction` of train is held out.
A row becomes encoder ids `[prefix + source][:seq_len - 1] + [sep]` (padded, with an attention mask)
and labels `[target][:target_len - 1] + [sep]` padded with -100 (ignored by the loss), the way
transformers' seq2seq examples pad labels.
"""

from __future__ import annotations

import csv
import json
import os

import torch

from zero_core import ConfigError

from .arrow_io import read_columns, read_schema_names
from .tokenize import Tokenizer

KEY = "data.text_pairs"
DEFAULT_COLUMNS = (("source", "target"), ("context", "response"), ("input", "output"))
TEXT_SUFFIXES = {".jsonl": "jsonl", ".json": "jsonl", ".csv": "csv", ".tsv": "tsv"}
ARROW_SUFFIXES = (".parquet", ".arrow")
IGNORE = -100


def _kind(path: str) -> str:
    ext = os.path.splitext(path)[1].lower()
    if ext in TEXT_SUFFIXES:
        return TEXT_SUFFIXES[ext]
    if ext in ARROW_SUFFIXES:
        return "arrow"
    raise ConfigError(f"{KEY}: {path} is not .jsonl, .json, .csv, .tsv, .parquet or .arrow; convert it to one of them")


def _json_object(path: str, n: int, line: str) -> dict:
    try:
        row = json.loads(line)
    except ValueError as e:
        raise ConfigError(f"{KEY}: {path} line {n} is not JSON ({e.args[0]}); write one object per line") from None
    if not isinstance(row, dict):
        raise ConfigError(f"{KEY}: {path} line {n} is a JSON {type(row).__name__}, not an object with named fields")
    return row


def _jsonl_rows(path: str, first_only: bool = False) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if line.strip():
                rows.append(_json_object(path, n, line))
                if first_only:
                    break
    return rows


def _table_rows(path: str, delimiter: str) -> list[dict]:
    with open(path, encoding="utf-8-sig", newline="") as f:
        quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL  # TSV: tabs only, quotes are text
        return list(csv.DictReader(f, delimiter=delimiter, quoting=quoting))


def column_names(path: str) -> list[str]:
    """The file's column names, reading as little as possible."""
    kind = _kind(path)
    if kind == "arrow":
        return read_schema_names(path, KEY)
    if kind == "jsonl":
        rows = _jsonl_rows(path, first_only=True)
        return list(rows[0]) if rows else []
    with open(path, encoding="utf-8-sig", newline="") as f:
        return next(csv.reader(f, delimiter="\t" if kind == "tsv" else ","), [])


def pick_columns(path: str, source: str | None, target: str | None) -> tuple[str, str]:
    """The (source, target) columns: the named ones, else the first default pair the file has."""
    names = column_names(path)
    if not names:
        raise ConfigError(f"{KEY}: {path} is empty; add source/target rows")
    if source is None and target is None:
        for pair in DEFAULT_COLUMNS:
            if all(c in names for c in pair):
                return pair
        raise ConfigError(f"{KEY}: {path} has columns {', '.join(names)}; name the text columns with "
                          "source_column and target_column (defaults: source/target, context/response, input/output)")
    missing = [c for c in (source, target) if c is None or c not in names]
    if missing:
        what = "source_column and target_column are both needed" if None in (source, target) else \
            f"column '{missing[0]}' is not in it"
        raise ConfigError(f"{KEY}: {path} has columns {', '.join(names)}; {what}")
    return source, target  # type: ignore[return-value]


def read_pairs(path: str, source: str, target: str) -> list[tuple[str, str]]:
    kind = _kind(path)
    if kind == "arrow":
        cols = read_columns(path, [source, target], KEY)
        rows = [{source: s, target: t} for s, t in zip(cols[source], cols[target])]
    else:
        rows = _jsonl_rows(path) if kind == "jsonl" else _table_rows(path, "\t" if kind == "tsv" else ",")
    pairs = []
    for n, row in enumerate(rows, start=1):
        s, t = row.get(source), row.get(target)
        if not isinstance(s, str) or not isinstance(t, str):
            raise ConfigError(f"{KEY}: {path} row {n} has no text in '{source}' or '{target}'; fix or remove the row")
        pairs.append((s, t))
    if not pairs:
        raise ConfigError(f"{KEY}: {path} has no rows")
    return pairs


def _fit(ids: list[int], length: int, end: int, pad: int) -> list[int]:
    ids = ids[: length - 1] + [end]
    return ids + [pad] * (length - len(ids))


def encode(pairs: list[tuple[str, str]], tok: Tokenizer, seq_len: int, target_len: int, prefix: str = ""
           ) -> dict[str, torch.Tensor]:
    src = [tok.encode(prefix + s) for s, _ in pairs]
    lengths = torch.tensor([min(len(x) + 1, seq_len) for x in src])
    return {
        "input_ids": torch.tensor([_fit(x, seq_len, tok.sep_id, tok.pad_id) for x in src]),
        "attention_mask": (torch.arange(seq_len)[None, :] < lengths[:, None]).long(),
        "labels": torch.tensor([_fit(tok.encode(t), target_len, tok.sep_id, IGNORE) for _, t in pairs]),
    }


def load_text_pairs(spec: dict, tok: Tokenizer, seq_len: int, target_len: int, eval_fraction: float, path
                    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(train, eval) tensors; `path` makes the spec's file names absolute."""
    train_file = path(spec["train"])
    cols = pick_columns(train_file, spec.get("source_column"), spec.get("target_column"))
    train = read_pairs(train_file, *cols)
    if spec.get("eval"):
        evals = read_pairs(path(spec["eval"]), *pick_columns(path(spec["eval"]), *cols))
    else:
        n_eval = max(1, round(len(train) * eval_fraction))
        if n_eval >= len(train):
            raise ConfigError(f"{KEY}: {train_file} has {len(train)} rows: too few to hold out an eval split; add eval")
        train, evals = train[:-n_eval], train[-n_eval:]
    prefix = spec.get("source_prefix") or ""
    return encode(train, tok, seq_len, target_len, prefix), encode(evals, tok, seq_len, target_len, prefix)
