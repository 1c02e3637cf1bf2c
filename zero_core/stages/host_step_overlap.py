"""Optimizer offload: the host update runs on its own thread after `step()` returns, and the next forward
waits per module for exactly the ranges it reads (`zero_core.overlap_weight_gather`, stages 1-3).

`step()` still takes the gradient norm, the clip coefficient and the skip decision before it returns; only
the chunked host AdamW and the publishing of its 16-bit output move to the thread, in partition order
(forward order). Publishing a chunk makes it readable and raises the published mark: where the 16-bit
shards live on the device it queues the chunk's copy up on the uploader's stream; where they live on the
host (stage 3 with `offload_param`, or a CPU run) the update's own write is the publication, so only the
mark moves. A module's forward pre-hook waits until the mark passes the end of each bucket it reads (a
stage-3 unit is one bucket), makes the compute stream wait for the copies, and hands the bucket on: stages
1-2 all-gather it there, stage 3 lets its gatherer (param_gather.py), whose hook runs next, gather it as
usual and prefetch only what `ready` says is published. Collectives stay on the training thread, in the same
order on every rank (forward order). Backward, checkpoints, `wait_for_weights()` and `module.state_dict()`
finish everything first. The update is the same computation: bitwise the same.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

import torch

from .. import worker_threads
from ..step_timer import StepBreakdown


class HostStepInFlight:
    def __init__(
        self,
        units: Sequence[tuple[torch.nn.Module, Sequence[int]]],
        bucket_ends: Sequence[int],
        root: torch.nn.Module,
        breakdown: StepBreakdown,
        *,
        uploader: Any = None,
        gather: Callable[[int], None] | None = None,
    ) -> None:
        """`units`: (module, the buckets its forward reads); `bucket_ends[i]`: where bucket i ends in the
        partition; `uploader`: copies published chunks up (None: the host write is the publication);
        `gather(i)`: what makes bucket i whole once published (None: the stage's own hooks do)."""
        self.bucket_ends, self.breakdown = list(bucket_ends), breakdown
        self.uploader, self._gather = uploader, gather
        self._cond = threading.Condition()
        self._published = 0
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._ready = set(range(len(self.bucket_ends)))  # nothing is owed before the first step
        # prepended: these waits run before any hook of the stage's that reads the bucket (stage 3's gather)
        self._hooks = [m.register_forward_pre_hook(self._waiter(tuple(b)), prepend=True) for m, b in units]
        self._hooks.append(root.register_state_dict_pre_hook(lambda *_: self.finish()))

    # -- the step ---------------------------------------------------------------------------------
    def begin(self) -> None:
        """A new update rewrites every shard: every bucket is owed again."""
        self.finish()
        self._published, self._ready = 0, set()

    def publish(self, a: int, b: int) -> None:
        """output[a:b] is final (the update's thread): copy it up where it must go, and raise the mark."""
        if self.uploader is not None:
            self.uploader.upload(a, b)
        with self._cond:
            self._published = max(self._published, b)
            self._cond.notify_all()

    def launch(self, update: Callable[[], None]) -> None:
        """Run the host update on its own thread; `step()` returns at once."""

        def run() -> None:
            try:
                update()
            except BaseException as e:  # surfaced on the training thread by the next wait
                self._error = e
            finally:
                with self._cond:
                    self._published = max(self.bucket_ends, default=0)
                    self._cond.notify_all()

        self._thread = worker_threads.start(run, "zero_core-host-step")

    def end_step(self) -> None:
        """After the optimizer's step (or a reload): if it launched no update (a skipped step), nothing is
        owed; copies queued on the training thread are waited for here."""
        if self._thread is None:
            if self.uploader is not None:
                self.uploader.side.join()
            self._published, self._ready = max(self.bucket_ends, default=0), set(range(len(self.bucket_ends)))

    @property
    def running(self) -> bool:
        """An update was launched and not yet waited for: the shards are still being rewritten."""
        return self._thread is not None

    # -- the waits ----------------------------------------------------------------------------------
    def _waiter(self, buckets: tuple[int, ...]) -> Callable[..., None]:
        def before_forward(module: torch.nn.Module, args: Any) -> None:
            self.wait(buckets)

        return before_forward

    def wait(self, buckets: Sequence[int]) -> None:
        """Block until the update has published `buckets`, then make them visible (in index order, here)."""
        owed = sorted(b for b in buckets if b not in self._ready)
        if not owed:
            return
        with self.breakdown.host("update_wait"), self._cond:
            self._cond.wait_for(lambda: self._published >= self.bucket_ends[owed[-1]])
        self._make_visible(owed)

    def ready(self, buckets: Sequence[int]) -> bool:
        """Without blocking: True when `buckets` are published (and then made visible, as `wait` would)."""
        owed = sorted(b for b in buckets if b not in self._ready)
        if owed:
            with self._cond:
                if self._published < self.bucket_ends[owed[-1]]:
                    return False
            self._make_visible(owed)
        return True

    def _make_visible(self, owed: list[int]) -> None:
        self._raise()
        if self.uploader is not None:
            self.uploader.side.join()  # the compute stream waits for the copies queued so far
        for b in owed:
            if self._gather is not None:
                self._gather(b)
            self._ready.add(b)

    def finish(self) -> None:
        """The update done, every bucket visible (before backward and any reader of the weights)."""
        if self._thread is not None:
            with self.breakdown.host("update_wait"):
                self._thread.join()
            self._thread = None
        self._raise()
        self.wait(range(len(self.bucket_ends)))

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"the optimizer's host update failed: {error}") from error

    def remove(self) -> None:
        self.finish()
        for h in self._hooks:
            h.remove()
        self._hooks = []
