"""The logical, per-parameter view every checkpoint kind offers to converters and to resume.

A source lists its parameters (frozen ones included, tied names included) and loads one full fp32
tensor at a time, reading only the fragments that hold it, so memory stays near the largest tensor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import torch


class CheckpointError(ValueError):
    """A user-facing problem with a checkpoint path or its files; the message is one line with the fix."""


def step_count(t: torch.Tensor, where: str) -> int:
    """A saved optimizer step: one finite whole number >= 0, else one CheckpointError line naming `where`."""
    value = t.item() if t.numel() == 1 and not t.is_complex() else None
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value == int(value) and value >= 0):
        shown = value if value is not None else f"a tensor of shape {tuple(t.shape)}"
        raise CheckpointError(f"{where} holds {shown} as its step, not one finite whole number >= 0; the checkpoint is "
                              "damaged or crafted: copy it again from where it was saved")
    return int(value)


@dataclass(frozen=True)
class ParamInfo:
    """One entry of the model state dict as stored in a checkpoint."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # dtype the training run used for this tensor, e.g. "bfloat16" ("float32" for masters)
    trainable: bool = True
    tied_to: str | None = None  # another name holding the same storage (one stored copy)


@dataclass
class SourceSummary:
    """What `zbench inspect` prints."""

    kind: str  # "zbench" | "deepspeed" | "deepspeed-universal" | "dcp"
    path: str
    step: int | None
    stage: int | None
    world_size: int | None
    num_params: int  # elements, tied counted once
    dtypes: dict[str, int] = field(default_factory=dict)  # dtype -> element count
    bytes_on_disk: int = 0
    extra: dict[str, object] = field(default_factory=dict)


class CheckpointSource(Protocol):
    """Implemented by each reader (zbench, DeepSpeed ZeRO 1/2/3, DeepSpeed universal, DCP)."""

    def params(self) -> list[ParamInfo]:
        """Every state-dict entry in model order, frozen and tied ones included."""
        ...

    def load(self, name: str) -> torch.Tensor:
        """The full fp32 tensor `name` (CPU), reading only the fragments that hold it."""
        ...

    def summary(self) -> SourceSummary:
        ...

    def verify(self) -> list[str]:
        """Integrity problems (checksum mismatch, truncated or missing file), each naming the file; [] if sound."""
        ...


def full_state_dict(source: CheckpointSource, trainable_only: bool = False) -> dict[str, torch.Tensor]:
    """Every state-dict entry of `source`, full and fp32 on the CPU, in model order; tied names share one tensor
    (as in the module's state_dict()). `trainable_only` leaves out frozen parameters and buffers."""
    state: dict[str, torch.Tensor] = {}
    for info in source.params():
        if trainable_only and not info.trainable:
            continue
        state[info.name] = state[info.tied_to] if info.tied_to in state else source.load(info.name)
    return state
