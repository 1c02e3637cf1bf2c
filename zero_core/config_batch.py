"""DeepSpeed's batch-size rule: train_batch_size = micro * gas * world_size, any two of them giving the third.

Each refusal is one ConfigError line that says which value to change (config.py reports it with the config's
other problems).
"""

from __future__ import annotations

from .config_errors import ConfigError


def resolve_batch(train: int | None, micro: int | None, gas: int | None, *, world_size: int) -> tuple[int, int, int]:
    """DeepSpeed's rule: train_batch_size = micro * gas * world_size; any two give the third.

    Only one of train/micro given means gas = 1; None means absent (or "auto").
    """
    ws = world_size
    if train is None and micro is None:
        if gas is not None:
            raise ConfigError(
                "gradient_accumulation_steps alone does not fix the batch size; "
                "also set train_micro_batch_size_per_gpu or train_batch_size"
            )
        raise ConfigError(
            "no batch size: set train_micro_batch_size_per_gpu (per GPU) or train_batch_size (global) "
            "to a number ('auto' needs a trainer to fill it in)"
        )
    if train is None:
        gas = 1 if gas is None else gas
        return micro * gas * ws, micro, gas
    if micro is None:
        gas = 1 if gas is None else gas
        _divisible(train, [("gradient_accumulation_steps", gas), ("world_size", ws)], "train_micro_batch_size_per_gpu")
        return train, train // (gas * ws), gas
    if gas is None:
        _divisible(
            train, [("train_micro_batch_size_per_gpu", micro), ("world_size", ws)], "gradient_accumulation_steps"
        )
        return train, micro, train // (micro * ws)
    if train != micro * gas * ws:
        raise ConfigError(
            f"train_batch_size ({train}) must equal train_micro_batch_size_per_gpu * "
            f"gradient_accumulation_steps * world_size = {micro} * {gas} * {ws} = {micro * gas * ws}; "
            "fix one of them, or leave one out (or 'auto') to derive it"
        )
    return train, micro, gas


def _divisible(train: int, factors: list[tuple[str, int]], derived: str) -> None:
    names = " * ".join(n for n, _ in factors)
    values = " * ".join(str(v) for _, v in factors)
    product = 1
    for _, v in factors:
        product *= v
    if train % product:
        raise ConfigError(
            f"train_batch_size ({train}) is not divisible by {names} = {values} = {product}, "
            f"so {derived} cannot be derived; make train_batch_size a multiple of {product}"
        )
