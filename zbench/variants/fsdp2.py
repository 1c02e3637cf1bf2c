"""torch FSDP2: `fully_shard` on every transformer block and on the root, torch AdamW on DTensors.

bf16 uses a MixedPrecisionPolicy (bf16 compute, fp32 gradient reduction and fp32 sharded masters);
fp32 needs no policy. Runs on CPU ranks over gloo too. Gradient accumulation skips the
reduce-scatter until the boundary (`set_requires_gradient_sync`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from ..models.factory import ModelBundle
from .base import Variant
from .torch_optim import TorchOptim


class FSDP2Variant(Variant):
    engine = "fsdp2"

    def __init__(self, bundle: ModelBundle, ds: dict[str, Any], device: torch.device) -> None:
        super().__init__(bundle, ds, device)
        model = bundle.model.to(device)
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        bf16 = bool(ds.get("bf16", {}).get("enabled"))
        policy = (
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            if bf16
            else MixedPrecisionPolicy()
        )
        for block in bundle.blocks:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        # fp32 optimizer on the fp32 shards; the policy handles the 16-bit compute
        self.optim = TorchOptim(model.parameters(), {**ds, "bf16": {"enabled": False}}, dist.get_world_size(), device)
        self.model = model

    @property
    def target(self) -> Any:
        return self.model

    def backward(self, loss: torch.Tensor) -> None:
        self.model.set_requires_gradient_sync(self.optim.is_boundary())
        self.optim.backward(loss)

    def step(self) -> None:
        self.optim.step()

    def step_stats(self) -> dict[str, Any]:
        return self.optim.stats()
