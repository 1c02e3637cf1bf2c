"""The scenario's data section: exactly one source (MRPC, text files, text pairs or synthetic tokens) and
how much of it to use. Paths are relative to the scenario file; whether they exist is checked in plan_inputs.py.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from .limits import MAX_SEQ, Fraction, Samples, SeqLen, Strict, count, real
from .models.gpt import GPT_RANGES

DATA_SOURCES = ("mrpc_tsv", "mrpc_hf", "text_files", "text_pairs", "synthetic")


class SyntheticLengths(Strict):
    """Rows of varying length (normal, rounded, clipped to [min, seq_len]), right-padded with attention_mask 0."""

    mean: real(0, MAX_SEQ, lo_open=True)
    std: real(0, MAX_SEQ)
    min: SeqLen = 8


class SyntheticSpec(Strict):
    vocab: count(1, GPT_RANGES["vocab_size"][1]) | None = None  # default: the model's vocabulary
    train_samples: Samples = 1024
    eval_samples: Samples = 128
    lengths: SyntheticLengths | None = None  # default: every row seq_len tokens (classification/token tasks only)


class TextPairsSpec(Strict):
    """Seq2seq source/target pairs from local .jsonl/.json/.csv/.tsv/.parquet/.arrow files."""

    train: str = Field(min_length=1)
    eval: str | None = None  # default: the last eval_fraction of train
    source_column: str | None = None  # default: source/target, context/response or input/output
    target_column: str | None = None
    source_prefix: str = ""  # prepended to every source text (the article's "chatbot: ")


class DataSpec(Strict):
    mrpc_tsv: str | None = None  # a GLUE MRPC folder (train.tsv/dev.tsv or msr_paraphrase_*.txt)
    mrpc_hf: str | None = None  # MRPC as Hugging Face datasets left it: a folder, or `cache` (see data/mrpc_hf.py)
    text_files: list[str] | None = None  # plain-text files cut into blocks of seq_len tokens
    text_pairs: TextPairsSpec | None = None  # seq2seq source/target pairs
    synthetic: SyntheticSpec | None = None  # learnable synthetic tokens
    eval_fraction: Fraction = 0.1  # text_files/text_pairs without eval: share held out
    max_train_samples: Samples | None = None
    max_eval_samples: Samples | None = None

    @model_validator(mode="after")
    def _one_source(self) -> "DataSpec":
        given = [k for k in DATA_SOURCES if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                f"give exactly one data source ({', '.join(DATA_SOURCES[:-1])} or synthetic), "
                f"got {', '.join(given) or 'none'}"
            )
        return self

    @property
    def kind(self) -> str:
        return next(k for k in DATA_SOURCES if getattr(self, k) is not None)

    @property
    def real(self) -> bool:
        return self.synthetic is None
