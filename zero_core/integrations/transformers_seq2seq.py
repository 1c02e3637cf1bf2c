"""Seq2SeqTrainer on zero_core, as ZeroTrainer is Trainer: the same script and DeepSpeed config, one changed import.

    from zero_core.integrations.transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

`predict_with_generate` generates through the engine's model; at stage 3 a generate's direct call of the encoder
gathers what it reads (stages/param_gather.py), on every rank alike, as transformers' `synced_gpus` keeps them.
"""

from __future__ import annotations

import dataclasses

import transformers

from .transformers import TrainingArguments, ZeroTrainer


@dataclasses.dataclass
class Seq2SeqTrainingArguments(TrainingArguments, transformers.Seq2SeqTrainingArguments):
    """transformers.Seq2SeqTrainingArguments whose `deepspeed=` config zero_core runs (TrainingArguments)."""


class Seq2SeqTrainer(ZeroTrainer, transformers.Seq2SeqTrainer):
    """transformers.Seq2SeqTrainer with zero_core's engine where Trainer builds DeepSpeed's (ZeroTrainer)."""
