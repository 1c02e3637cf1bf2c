"""torch DistributedDataParallel + torch AdamW: the baseline every table compares against."""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any, ContextManager

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from zero_core.comm import simulated

from ..models.factory import ModelBundle
from .base import Variant
from .torch_optim import TorchOptim


class DDPVariant(Variant):
    engine = "ddp"

    def __init__(self, bundle: ModelBundle, ds: dict[str, Any], device: torch.device) -> None:
        super().__init__(bundle, ds, device)
        model = bundle.model.to(device)
        ids = [device.index] if device.type == "cuda" else None
        # transformers models can leave parameters unused (Longformer's global-attention projections without
        # global tokens): find them as HF's Trainer does by default; zbench's own GPT uses every parameter
        unused = bundle.family == "hf"
        self.ddp = DistributedDataParallel(model, device_ids=ids, find_unused_parameters=unused)  # broadcasts rank 0's
        if simulated():  # the fake process group's all-reduce yields no tensor, which DDP's default hook needs
            self.ddp.register_comm_hook(None, _local_bucket)
        self.optim = TorchOptim(model.parameters(), ds, dist.get_world_size(), device)
        self._no_sync = ExitStack()

    @property
    def target(self) -> Any:
        return self.ddp

    def autocast(self) -> ContextManager:
        dtype = self.optim.dtype
        return torch.autocast(self.device.type, dtype=dtype, enabled=dtype != torch.float32)

    def forward(self, batch: dict[str, torch.Tensor]) -> Any:
        if self.ddp.training and not self.optim.is_boundary():
            self._no_sync.enter_context(self.ddp.no_sync())  # accumulate locally; reduce at the boundary
        return super().forward(batch)

    def backward(self, loss: torch.Tensor) -> None:
        self.optim.backward(loss)
        self._no_sync.close()

    def step(self) -> None:
        self.optim.step()

    def step_stats(self) -> dict[str, Any]:
        return self.optim.stats()


def _local_bucket(state, bucket):  # unannotated: DDP checks annotations as objects, these would be strings
    """Simulated ranks (`--simulate-ranks`): the bucket reduced over one rank, i.e. as it is."""
    done = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done
