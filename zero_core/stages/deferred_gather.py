"""Stages 1-2: the all-gather of updated weights, overlapped with the rest of the step and the next forward.

As soon as the optimizer has updated a bucket's shard, that bucket's all-gather starts (asynchronously)
and the optimizer goes on with the next bucket. Nothing waits for it until a module that reads the
bucket is about to run: a forward pre-hook on each unit (the parameters outside the transformer blocks,
then each block, grouped as stage 3 groups them) waits for exactly the buckets holding its parameters.
The engine's own readers (checkpoints, full_state_dict, backward, the next step) and `module.state_dict()`
wait for everything; code that reads parameters directly between `step()` and the next forward calls
`engine.wait_for_weights()` first, which is why zero_core.overlap_weight_gather is off unless turned on.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from ..comm import PendingCollective


class DeferredWeightGather:
    def __init__(self, units: Sequence[tuple[torch.nn.Module, Sequence[int]]],
                 start: Callable[[int], PendingCollective], root: torch.nn.Module) -> None:
        """`units`: (module, buckets its forward reads); `start(i)` launches bucket i's all-gather."""
        self._start = start
        self._pending: dict[int, PendingCollective] = {}
        self._hooks = [m.register_forward_pre_hook(self._waiter(tuple(b))) for m, b in units]
        self._hooks.append(root.register_state_dict_pre_hook(lambda *_: self.wait_all()))

    def _waiter(self, buckets: tuple[int, ...]) -> Callable[..., None]:
        def before_forward(module: torch.nn.Module, args: Any) -> None:
            if self._pending:
                self.wait(buckets)
        return before_forward

    def start(self, bucket: int) -> None:
        """Launch bucket `bucket`'s all-gather (its shard is final)."""
        self.wait((bucket,))  # never two gathers into one buffer at once
        self._pending[bucket] = self._start(bucket)

    def wait(self, buckets: Sequence[int]) -> None:
        for b in buckets:
            work = self._pending.pop(b, None)
            if work is not None:
                work.wait()

    def wait_all(self) -> None:
        self.wait(sorted(self._pending))

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def remove(self) -> None:
        self.wait_all()
        for h in self._hooks:
            h.remove()
        self._hooks = []
