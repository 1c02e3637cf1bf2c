"""`load_best_model_at_end` on zero_core's engine, as Trainer does it with DeepSpeed.

- Trainer with DeepSpeed loads the best `checkpoint-N/` through DeepSpeed's `load_checkpoint` with the optimizer
  and schedule states (transformers' `deepspeed_load_checkpoint`), so after `train()` the engine's step, lrs and
  Adam moments are the best checkpoint's as well as its weights: a checkpoint saved from there continues from it.
- With `save_only_model=True` the folders hold no engine checkpoint to load the best from; transformers refuses
  that pair when it builds the Trainer, and so does ZeroTrainer (else the last weights would stay in place while
  `state.best_model_checkpoint` names another step).
"""

from __future__ import annotations

from typing import Any

from ..checkpoint_load import nothing_to_resume


def refuse_best_without_states(args: Any) -> None:
    if args.save_only_model and args.load_best_model_at_end:
        raise ValueError(
            "TrainingArguments(save_only_model=True, load_best_model_at_end=True): the checkpoints would hold no "
            "engine states to load the best model from; drop save_only_model or load_best_model_at_end"
        )


def load_best(engine: Any, folder: str) -> None:
    """Collective: the best checkpoint's weights, optimizer states, schedule and step into `engine`."""
    if nothing_to_resume(folder):  # DeepSpeed's Trainer refuses it too, rather than keep the last weights
        raise ValueError(f"load_best_model_at_end: the best checkpoint {folder!r} holds no zbench or DeepSpeed "
                         "checkpoint ('latest', global_stepN/) to load; keep that folder as Trainer saved it")
    engine.load_checkpoint(folder)
