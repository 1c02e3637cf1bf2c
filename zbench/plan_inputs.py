"""The model and data a scenario names, checked against this machine before any launch.

Each check raises a one-line `ScenarioError` naming the problem and the fix: a pretrained path that is not a
folder, an architecture that needs transformers when it is missing, a sequence longer than the model's positions,
a vocabulary too small for the data, data files that do not exist or do not fit the task, a GPT loss slice
size (ZBENCH_LOSS_SLICE_BYTES) that is not a number of bytes.
"""

from __future__ import annotations

import importlib.util
import os

from .models.configs import ArchConfig, load_arch
from .models.sliced_loss import SLICE_BYTES, slice_bytes
from .scenario import Scenario, ScenarioError


def transformers_available() -> bool:
    return importlib.util.find_spec("transformers") is not None


def _need_transformers(what: str) -> None:
    if not transformers_available():
        raise ScenarioError(
            f"{what} needs Hugging Face transformers, which is not installed here; "
            "pip install transformers (or use a gpt-family arch such as tiny-gpt)"
        )


def check_model(sc: Scenario, base_dir: str) -> ArchConfig | None:
    m = sc.model
    if m.pretrained:
        looks_local = m.pretrained.startswith((".", "/", "~")) or os.path.exists(os.path.join(base_dir, m.pretrained))
        if looks_local and not os.path.isdir(abs_path(m.pretrained, base_dir)):
            raise ScenarioError(
                f"model.pretrained '{m.pretrained}' is not a folder; pass a local model folder or a hub id"
            )
        if looks_local and not os.path.isfile(os.path.join(abs_path(m.pretrained, base_dir), "config.json")):
            raise ScenarioError(f"model.pretrained '{m.pretrained}' has no config.json; pass a folder written by "
                                "save_pretrained (or a hub id)")
        _need_transformers(f"model.pretrained '{m.pretrained}'")
        return None
    arch = load_arch(str(m.arch), base_dir, m.overrides)  # every value checked, the file's and the overrides'
    if arch.family == "hf":
        _need_transformers(f"model '{arch.name}' (a transformers architecture)")
    elif sc.task not in ("lm", "classification"):
        raise ScenarioError(
            f"task '{sc.task}' needs a transformers model; zbench's GPT ('{arch.name}') does lm and classification"
        )
    if arch.family == "gpt":
        try:  # read again by each rank where it takes the loss: a bad value is told here, once, before any launch
            slice_bytes()
        except ValueError as e:
            raise ScenarioError(f"{e}; unset it, or give a size such as {SLICE_BYTES}") from None
    if arch.max_positions and sc.seq_len > arch.max_positions:
        raise ScenarioError(
            f"seq_len {sc.seq_len} exceeds the {arch.max_positions} positions of '{arch.name}'; lower seq_len"
        )
    if sc.task == "seq2seq" and arch.max_positions and (sc.target_len or 0) > arch.max_positions:
        raise ScenarioError(
            f"target_len {sc.target_len} exceeds the {arch.max_positions} positions of '{arch.name}'; lower target_len"
        )
    from .data.tokenize import ByteTokenizer

    byte_ids = ByteTokenizer.vocab_size  # real text without a tokenizer is read as bytes
    if sc.data.real and not (m.tokenizer or m.pretrained) and arch.vocab_size and arch.vocab_size < byte_ids:
        raise ScenarioError(
            f"real text without model.tokenizer is read as bytes ({byte_ids} ids), but '{arch.name}' "
            f"has a vocabulary of {arch.vocab_size}; name a tokenizer or raise vocab_size"
        )
    syn = sc.data.synthetic
    if syn and syn.vocab and arch.vocab_size and syn.vocab > arch.vocab_size:
        raise ScenarioError(
            f"data.synthetic.vocab {syn.vocab} exceeds the {arch.vocab_size} tokens of '{arch.name}'; "
            "lower it or leave it out (default: the model's vocabulary)"
        )
    if sc.task == "token_classification" and not m.num_labels:
        raise ScenarioError("task token_classification needs model.num_labels (the number of tag classes); set it")
    return arch


def abs_path(path: str, base_dir: str) -> str:
    path = os.path.expanduser(path)
    return path if os.path.isabs(path) else os.path.normpath(os.path.join(base_dir, path))


# data source -> (the task it feeds, what it is)
DATA_TASKS = {
    "mrpc_tsv": ("classification", "is a sentence-pair classification set"),
    "mrpc_hf": ("classification", "is a sentence-pair classification set"),
    "text_files": ("lm", "trains a language model"),
    "text_pairs": ("seq2seq", "holds source/target pairs for a seq2seq model"),
}


def check_data(sc: Scenario, base_dir: str) -> None:
    from .data.mrpc import find_mrpc_files
    from .data.mrpc_hf import find_mrpc_hf, resolve
    from .data.pairs import pick_columns
    from .data.text import byte_tokens, too_short

    d = sc.data
    if d.mrpc_tsv is not None:
        find_mrpc_files(abs_path(d.mrpc_tsv, base_dir))  # raises a one-line error naming the layouts
    if d.mrpc_hf is not None:
        find_mrpc_hf(resolve(d.mrpc_hf, base_dir))  # and checks the columns
    if d.text_files is not None:
        if not d.text_files:
            raise ScenarioError("data.text_files lists no file; name at least one text file")
        for f in d.text_files:
            path = abs_path(f, base_dir)
            if not os.path.isfile(path):
                what = "is not a regular file" if os.path.lexists(path) else "does not exist"
                raise ScenarioError(f"data.text_files: {f} {what}; name a text file (paths are relative to the "
                                    "scenario file)")
        if not (sc.model.tokenizer or sc.model.pretrained):  # read as bytes: counted here as each rank counts
            paths = [abs_path(f, base_dir) for f in d.text_files]
            try:
                n_tokens = byte_tokens(paths, sc.seq_len)
            except OSError as e:
                raise ScenarioError(f"data.text_files: {e.filename} cannot be read ({e.strerror}); make it readable "
                                    "or name another file") from None
            problem = None if n_tokens is None else too_short(n_tokens, sc.seq_len)
            if problem:
                raise ScenarioError(problem)
    if d.text_pairs is not None:
        given = [f for f in (d.text_pairs.train, d.text_pairs.eval) if f]
        for f in given:
            if not os.path.isfile(abs_path(f, base_dir)):
                raise ScenarioError(
                    f"data.text_pairs: {f} does not exist (paths are relative to the scenario file); fix the path"
                )
        cols = pick_columns(abs_path(given[0], base_dir), d.text_pairs.source_column, d.text_pairs.target_column)
        for f in given[1:]:
            pick_columns(abs_path(f, base_dir), *cols)
    if d.kind in DATA_TASKS and sc.task != DATA_TASKS[d.kind][0]:  # the files exist: now, do they fit the task?
        task, what = DATA_TASKS[d.kind]
        raise ScenarioError(f"data.{d.kind} {what}; set task: {task} (got {sc.task})")
    if sc.metric == "bleu" and d.text_pairs is None:
        raise ScenarioError(
            f"metric 'bleu' needs real text pairs (data.text_pairs), not data.{d.kind}; use metric: loss"
        )
