"""Stage 0: plain data parallelism. Every rank holds every weight, gradient and optimizer state.

Gradients accumulate in persistent flat buckets across micro-steps and are all-reduced once per
optimizer step, at the accumulation boundary; every rank then runs the same update over the whole
partition, writing the 16-bit weights straight into the working buffer.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import comm
from .base import Stage


class ReplicatedStage(Stage):
    persistent_buckets = True
    reduces_every_micro_step = False

    def attach(self, optimizer: Any, breakdown: Any) -> None:
        assert not optimizer.on_host, "the config refuses optimizer offload at stage 0"
        self.local = self.output = self.flat  # the layout has one shard: the whole buffer

    def reduce(self, bucket: torch.Tensor, group: Any) -> torch.Tensor:
        comm.all_reduce_sum(bucket, what=f"all-reduce of gradient bucket {group.index}")
        return bucket
