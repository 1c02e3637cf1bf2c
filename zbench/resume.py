"""Periodic zero_core checkpoints inside `zbench run`, and continuing from them with `--resume`.

The checkpoint holds the engine state (resharded on load, so the rerun may use another number of
ranks or another stage), how many micro-steps were done, and the loss curve so far. The data stream
is deterministic, so the rerun regenerates it and skips the rows already trained on.
"""

from __future__ import annotations

import os
from typing import Any

import torch


class Checkpointing:
    def __init__(self, folder: str | None, every: int | None, grad_accum: int, variant: Any) -> None:
        engine = getattr(variant, "engine_obj", None)
        self.enabled = bool(folder and every and engine is not None)
        self.folder, self.every, self.gas, self.engine = folder, every or 0, grad_accum, engine

    def resume(self, losses: list[torch.Tensor], device: torch.device) -> int:
        """Load the latest checkpoint if there is one; returns the micro-steps it covers."""
        if not self.enabled or not os.path.isfile(os.path.join(str(self.folder), "latest")):
            return 0
        _, state = self.engine.load_checkpoint(self.folder)
        # already the mean over ranks: every rank holding it, the final sum-and-average leaves it unchanged
        losses.extend(torch.tensor(x, device=device) for x in state["losses"])
        return int(state["micro_step"])

    def after_micro_step(self, micro_step: int, losses: list[torch.Tensor]) -> None:
        """Save every `every` optimizer steps (keeping the two newest)."""
        if self.enabled and micro_step % (self.every * self.gas) == 0:
            curve = torch.stack(losses)
            if torch.distributed.is_initialized():  # rank 0 writes the client state: store the mean over ranks
                torch.distributed.all_reduce(curve)
                curve /= torch.distributed.get_world_size()
            state = {"micro_step": micro_step, "losses": curve.tolist()}
            self.engine.save_checkpoint(self.folder, client_state=state, keep_last=2)
