"""Data for the scenario runner: MRPC (GLUE TSV or Hugging Face datasets files), local text files,
seq2seq text pairs, or synthetic tokens, as tensor splits.

`build_splits` returns the train and eval tensors every rank holds in full (the batch iterator then
takes each rank's rows), and says whether the data is real or synthetic: a table never passes a
synthetic-data number off as the article's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from zero_core import ConfigError

from .batches import Batch, truncate
from .mrpc import load_mrpc
from .mrpc_hf import load_mrpc_hf, resolve
from .pairs import load_text_pairs
from .synthetic import synthetic_split, synthetic_tokens
from .text import load_text_blocks
from .tokenize import ByteTokenizer, Tokenizer, load_tokenizer

__all__ = ["Splits", "build_splits", "synthetic_tokens"]


@dataclass
class Splits:
    train: Batch
    eval: Batch
    real: bool
    description: str  # e.g. "MRPC (real, 3668/408 pairs, bytes tokenizer)"
    tokenizer: Tokenizer | None = None  # real text: turns generated ids back into text (BLEU)


def build_splits(data: dict, *, task: str, seq_len: int, vocab: int | None, seed: int, base_dir: str,
                 tokenizer: str | None = None, num_labels: int = 2, target_len: int | None = None) -> Splits:
    """The scenario's `data` section (as a dict) turned into tensors."""
    def path(p: str) -> str:
        p = os.path.expanduser(p)
        return p if os.path.isabs(p) else os.path.join(base_dir, p)

    tok: Tokenizer | None = None
    if data.get("synthetic") is not None:
        syn = data["synthetic"]
        v = syn.get("vocab") or vocab
        if not v:
            raise ConfigError("data.synthetic.vocab is needed: the model does not say its vocabulary size")
        if vocab and v > vocab:
            raise ConfigError(f"data.synthetic.vocab {v} exceeds the model's vocabulary {vocab}; lower it")
        lengths = syn.get("lengths")
        train = synthetic_split(task, syn.get("train_samples", 1024), seq_len, v, seed, num_labels=num_labels,
                                target_len=target_len, lengths=lengths)
        evals = synthetic_split(task, syn.get("eval_samples", 128), seq_len, v, seed + 7919, num_labels=num_labels,
                                target_len=target_len, lengths=lengths)
        desc = "synthetic" if lengths is None else (f"synthetic, row lengths ~N({lengths['mean']:g}, "
                                                    f"{lengths['std']:g}) in [{lengths.get('min', 8)}, {seq_len}]")
        real = False
    else:
        tok = load_tokenizer(tokenizer)
        if vocab and isinstance(tok, ByteTokenizer) and vocab < tok.vocab_size:
            raise ConfigError(f"the byte tokenizer needs a vocabulary of {tok.vocab_size}, the model has {vocab}; "
                              "name a tokenizer (model.tokenizer) or use synthetic data")
        if data.get("mrpc_tsv"):
            train, evals = load_mrpc(path(data["mrpc_tsv"]), tok, seq_len)
            desc = f"MRPC ({tok.name} tokens)"
        elif data.get("mrpc_hf"):
            train, evals = load_mrpc_hf(resolve(data["mrpc_hf"], base_dir), tok, seq_len)
            desc = f"MRPC from datasets files ({tok.name} tokens)"
        elif data.get("text_pairs"):
            train, evals = load_text_pairs(data["text_pairs"], tok, seq_len, target_len or seq_len,
                                           data.get("eval_fraction", 0.1), path)
            desc = f"text pairs ({tok.name} tokens)"
        else:
            train, evals = load_text_blocks([path(p) for p in data["text_files"]], tok, seq_len,
                                            data.get("eval_fraction", 0.1))
            desc = f"text files ({tok.name} tokens)"
        real = True
    train = truncate(train, data.get("max_train_samples"))
    evals = truncate(evals, data.get("max_eval_samples"))
    n_train, n_eval = (next(iter(s.values())).shape[0] for s in (train, evals))
    return Splits(train, evals, real, f"{desc}, {n_train} train / {n_eval} eval rows", tok)
