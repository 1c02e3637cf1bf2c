"""What every engine variant offers the training loop: forward, backward, step, train/eval.

The loop never knows which engine it drives; a variant is built from the model bundle and the
variant's DeepSpeed-style dict (the one config every engine reads its optimizer, schedule, clipping,
accumulation and precision from, so that a comparison changes only the engine).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import nullcontext
from typing import Any, ContextManager

import torch

from ..models.factory import Batch, ModelBundle


class Variant(ABC):
    """A model wrapped by one data-parallel engine."""

    engine: str = ""

    def __init__(self, bundle: ModelBundle, ds: dict[str, Any], device: torch.device) -> None:
        self.bundle = bundle
        self.ds = ds
        self.device = device

    @property
    @abstractmethod
    def target(self) -> Any:
        """What a forward calls: the wrapped module or the engine object."""

    def autocast(self) -> ContextManager:
        return nullcontext()

    def forward(self, batch: Batch) -> Any:
        """Run the model on one micro-batch; the result has `.loss` and `.logits`."""
        with self.autocast():
            return self.bundle.call(self.target, batch)

    @abstractmethod
    def backward(self, loss: torch.Tensor) -> None: ...

    @abstractmethod
    def step(self) -> None:
        """Called after every micro-batch; updates the weights at accumulation boundaries."""

    def step_stats(self) -> dict[str, Any]:
        """The last optimizer step's learning_rate, grad_norm, loss_scale and skipped_steps (numbers, or device
        tensors read later in one batch, so that live logging does not stall the device every step)."""
        return {}

    def train(self) -> None:
        self.bundle.model.train()

    def eval(self) -> None:
        self.bundle.model.eval()


class EngineObjectVariant(Variant):
    """An engine with DeepSpeed's engine API (zero_core, DeepSpeed): the engine object does it all."""

    engine_obj: Any

    @property
    def target(self) -> Any:
        return self.engine_obj

    def backward(self, loss: torch.Tensor) -> None:
        self.engine_obj.backward(loss)

    def step(self) -> None:
        self.engine_obj.step()

    def step_stats(self) -> dict[str, Any]:
        """Through DeepSpeed's engine API (zero_core's engine offers the same calls)."""
        e = self.engine_obj
        scaler = getattr(e, "optimizer", None)
        scale = getattr(scaler, "loss_scale", None) if e.__class__.__module__.startswith("deepspeed") else e.loss_scale
        norm = e.get_global_grad_norm()
        return {"learning_rate": e.get_lr()[0], "grad_norm": None if norm is None else float(norm),
                "loss_scale": scale, "skipped_steps": getattr(e, "skipped_steps", None)}

    def train(self) -> None:
        self.engine_obj.train()

    def eval(self) -> None:
        self.engine_obj.eval()
