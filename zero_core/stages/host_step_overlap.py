"""Stages 1-2 with optimizer offload: the host update runs on its own thread after `step()` returns, and the
next forward waits per module for exactly the buckets it reads (`zero_core.overlap_weight_gather`).

`step()` still takes the gradient norm, the clip coefficient and the skip decision before it returns; only
the chunked host AdamW and the uploads move to the thread, in partition order (forward order). Each chunk
the thread finishes is copied up on the uploader's stream and raises the published mark. A module's
forward pre-hook waits until the mark passes the end of each bucket it reads, makes the compute stream
wait for the copies, and all-gathers that bucket on the training thread: collectives stay on one thread,
in the same order on every rank (forward order). Backward, checkpoints, `wait_for_weights()` and
`module.state_dict()` finish everything first. The update is the same computation: bitwise the same.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

import torch


class HostStepInFlight:
    def __init__(
        self,
        units: Sequence[tuple[torch.nn.Module, Sequence[int]]],
        bucket_ends: Sequence[int],
        uploader: Any,
        gather: Callable[[int], None],
        root: torch.nn.Module,
    ) -> None:
        self.bucket_ends, self.uploader, self._gather = list(bucket_ends), uploader, gather
        self._cond = threading.Condition()
        self._published = 0
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._gathered = set(range(len(self.bucket_ends)))  # nothing is owed before the first step
        self._hooks = [m.register_forward_pre_hook(self._waiter(tuple(b))) for m, b in units]
        self._hooks.append(root.register_state_dict_pre_hook(lambda *_: self.finish()))

    # -- the step ---------------------------------------------------------------------------------
    def begin(self) -> None:
        """A new update rewrites every shard: every bucket is owed a gather again."""
        self.finish()
        self._published, self._gathered = 0, set()

    def publish(self, a: int, b: int) -> None:
        """output[a:b] is final (the update's thread): copy it up and raise the mark."""
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

        self._thread = threading.Thread(target=run, name="zero_core-host-step", daemon=True)
        self._thread.start()

    def end_step(self) -> None:
        """After the optimizer's step: if it launched no update (a skipped step), nothing changed and nothing is
        owed."""
        if self._thread is None:
            self._published, self._gathered = max(self.bucket_ends, default=0), set(range(len(self.bucket_ends)))

    # -- the waits ----------------------------------------------------------------------------------
    def _waiter(self, buckets: tuple[int, ...]) -> Callable[..., None]:
        def before_forward(module: torch.nn.Module, args: Any) -> None:
            self.wait(buckets)

        return before_forward

    def wait(self, buckets: Sequence[int]) -> None:
        """Gather `buckets` once the update has published them (in index order, on this thread)."""
        owed = sorted(b for b in buckets if b not in self._gathered)
        if not owed:
            return
        with self._cond:
            self._cond.wait_for(lambda: self._published >= self.bucket_ends[owed[-1]])
        self._raise()
        self.uploader.side.join()  # the compute stream waits for the copies queued so far
        for b in owed:
            self._gather(b)
            self._gathered.add(b)

    def finish(self) -> None:
        """The update done, every bucket gathered (before backward and any reader of the weights)."""
        if self._thread is not None:
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
