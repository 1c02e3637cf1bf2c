"""Some chunks of the offloaded share updated on the GPU, their states streamed over PCIe
(`zero_core.offload_stream_fraction`).

The host AdamW is bound by host memory traffic (28 bytes per element at fp16), and on the machines measured
it is the cores that set that bound, not the memory: the GPU's copy engines add bandwidth beside them. On one
H100 machine the host updated 2.9-3.2 G elements/s while a stream like this one updated another 2.5-3.1 G
elements/s of other states (docs/benchmarks/2026-11-26_h100_streamed_update.md). So `fraction` of the host
share's chunks, spread evenly through it, keep their states in host memory (page-locked in place) and, per
chunk, go up with their gradient, through the device's fused AdamW and back down with their 16-bit weights,
on three streams (up, update, down) over `SLOTS` device buffers, while the host updates the chunks between
them. Nothing stays on the device between steps: the device memory it takes is the buffers (`SLOTS` x 20
bytes x the chunk at fp16). Streamed chunks are never updated during backward (`overlap_host_update` applies
to the host's chunks): the device's update starts once the step knows the clip coefficient.

Once its own chunks are queued, the GPU takes the host's remaining chunks from the back, one whenever a buffer
frees, while the host works from the front, until the two meet (`zero_core.offload_stream_balance`,
chunk_claims.py): neither side waits for the other at the end, on machines whose host and PCIe rates differ.

Both sides advance through the partition together, but finish chunks in any order, and the 16-bit weights are
published in partition order (the next forward waits per module for them): `InOrder` holds back a finished
range until all before it are out, so the prefix the forward may read grows at the two sides' combined rate.
The update is the device kernel's, with the step's lr, step count and clip coefficient: what a device share
(ratio < 1) computes. On a CPU run the "device" is the host and the result is the host path's, bitwise.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable

import torch

from .. import worker_threads
from ..kernels import adamw_step
from ..pinned import lock_all, unlock
from .chunk_claims import ChunkClaims
from .nvme_states import ALIGN
from .states import NAMES

SLOTS = 3  # up, update and down in flight at once
Publish = Callable[[int, int], None]
Held = Callable[[int, int], "torch.Tensor | None"]
Claims = tuple[ChunkClaims, int]  # the host's chunks, and their size


def streamed_chunks(numel: int, fraction: float, chunk: int) -> list[tuple[int, int]]:
    """Which chunks of a `numel`-element host share the GPU updates: `fraction` of them, spread evenly, so that
    the host's chunks and the GPU's both advance through the partition in step and the published prefix grows
    at their combined rate (chunk boundaries are multiples of the alignment: the host's pieces vectorise as
    before)."""
    assert chunk % ALIGN == 0
    count = -(-numel // chunk)
    return [(i * chunk, min(numel, (i + 1) * chunk)) for i in range(count)
            if int((i + 1) * fraction + 1e-9) > int(i * fraction + 1e-9)]


class InOrder:
    """Publishes finished ranges in partition order, from element 0 on: a range that finishes early waits for
    the ones before it."""

    def __init__(self, publish: Publish | None) -> None:
        self.publish, self.next = publish, 0
        self._held: dict[int, int] = {}

    def done(self, a: int, b: int) -> None:
        self._held[a] = b
        while self.next in self._held:
            a = self.next
            self.next = self._held.pop(a)
            if self.publish is not None:
                self.publish(a, self.next)


class StreamedUpdate:
    """AdamW over some chunks of the host share (`ranges`, in partition order) on `device`."""

    def __init__(self, ranges: list[tuple[int, int]], device: torch.device, takes_host_chunks: bool = False) -> None:
        self.ranges, self.device = ranges, device
        self.takes_host_chunks = takes_host_chunks  # may be given `claims` (then it locks the whole partition)
        self.chunk = max(b - a for a, b in ranges)
        self.cuda = device.type == "cuda"
        self._slots: list[dict[str, torch.Tensor]] | None = None  # allocated at the first step
        self._pinned: list[torch.Tensor] = []
        self.streams = [torch.cuda.Stream(device) for _ in range(3)] if self.cuda else [None] * 3

    def _buffers(self, grad_dtype: torch.dtype, out_dtype: torch.dtype | None) -> list[dict[str, torch.Tensor]]:
        if self._slots is None:
            def slot() -> dict[str, torch.Tensor]:
                bufs = {n: torch.empty(self.chunk, dtype=torch.float32, device=self.device) for n in NAMES}
                bufs["grad"] = torch.empty(self.chunk, dtype=torch.float32, device=self.device)
                bufs["grad16"] = torch.empty(self.chunk, dtype=grad_dtype, device=self.device)
                if out_dtype is not None:
                    bufs["out"] = torch.empty(self.chunk, dtype=out_dtype, device=self.device)
                return bufs

            self._slots = [slot() for _ in range(SLOTS)]
        return self._slots

    def start(self, states, grad: Callable[[int, int], tuple[torch.Tensor, float | None]], out: torch.Tensor | None,
              pieces: Callable[[int, int], list[tuple[int, int, int]]], hyper: list[dict], coef: float,
              step: torch.Tensor, decoupled: bool, held: Held | None = None,
              held_ready: torch.cuda.Event | None = None, claims: Claims | None = None) -> Running:
        """Queue the whole streamed update (on a helper thread: queuing is host work too) and return at once.
        `grad(a, b)` gives the gradient source of [a, b) and the scale to apply (None: it is the fp32 gradient);
        `held(a, b)` the chunk's gradient already on the device (held_grads.py; written on another stream up
        to `held_ready`), or None; `pieces(a, b)` its (lo, hi, group) runs; `hyper` the host step's per-group
        arguments; `claims` the host's chunks this update may take from the back once its own are queued
        (chunk_claims.py: `(claims, chunk)`)."""
        if self.cuda:  # asynchronous copies need page-locked memory
            # the span of the streamed chunks, locked whole (the host's between them too); all of it if the GPU
            # may take the host's chunks in any step (a range overlapping one locked before cannot be locked)
            assert claims is None or self.takes_host_chunks
            end = states.numel if self.takes_host_chunks else self.ranges[-1][1]
            self._pinned += lock_all([getattr(states, n)[:end] for n in NAMES] + [grad(0, end)[0]] + (
                [] if out is None else [out[:end]]), "lower zero_core.offload_stream_fraction (0 streams nothing) "
                "or raise the locked-memory limit (ulimit -l)")
        src0, _ = grad(0, 1)
        slots = self._buffers(src0.dtype, None if out is None else out.dtype)
        scalar = lambda x, dt=torch.float32: torch.tensor(x, dtype=dt, device=self.device)  # noqa: E731
        # made on the update's own stream, and kept until finish(): the next forward allocates on the default
        # stream meanwhile, and must not be handed their memory while the update still reads them
        with torch.cuda.stream(self.streams[1]):
            args = dict(lrs=scalar([h["lr"] for h in hyper]), step=step.to(self.device), coef=scalar([coef]),
                        skip=scalar([0], torch.int32), decoupled=decoupled)
        running = Running(self)
        running.args = args
        running.thread = worker_threads.start(
            lambda: running.queue(states, grad, out, pieces, hyper, slots, args, held, held_ready, claims),
            "zero_core-streamed-update")
        return running

    def close(self) -> None:
        for t in self._pinned:
            unlock(t)
        self._pinned, self._slots = [], None


class Running:
    """One step's streamed update: its chunks, in order, and whether each has landed back in host memory."""

    def __init__(self, owner: StreamedUpdate) -> None:
        self.owner = owner
        self.landed: list[tuple[int, int, torch.cuda.Event | None]] = []  # appended by the queuing thread
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self._taken = 0
        self.started = time.perf_counter()
        self.args: dict = {}

    def queue(self, states, grad, out, pieces, hyper, slots, args, held, held_ready, claims) -> None:
        try:
            self._queue(states, grad, out, pieces, hyper, slots, args, held, held_ready, claims)
        except BaseException as e:  # raised on the host update's thread by finish()
            self.error = e

    def _queue(self, states, grad, out, pieces, hyper, slots, args, held, held_ready, claims) -> None:
        o = self.owner
        if o.streams[1] is not None and held_ready is not None:
            o.streams[1].wait_event(held_ready)
        freed: list[torch.cuda.Event | None] = [None] * len(slots)
        for i, (a, b) in enumerate(o.ranges):
            on_device = None if held is None else held(a, b)  # the gradient, if it never left the device
            freed[i % len(slots)] = self._one(a, b, slots[i % len(slots)], freed[i % len(slots)], on_device,
                                              states, grad, out, pieces, hyper, args)
        if claims is None:
            return
        taken, chunk = claims
        for i in itertools.count(len(o.ranges)):
            slot = i % len(slots)
            if freed[slot] is not None:  # claim a chunk only once a buffer is free for it: the host keeps the rest
                freed[slot].synchronize()
            a = taken.back()
            if a is None:
                return
            b = min(states.numel, a + chunk)
            freed[slot] = self._one(a, b, slots[slot], freed[slot], None, states, grad, out, pieces, hyper, args)

    def _one(self, a, b, s, freed, on_device, states, grad, out, pieces, hyper, args) -> torch.cuda.Event | None:
        """Queue chunk [a, b) on slot `s` (free once `freed` has passed): up, update, down; its landing event."""
        up, work, down = self.owner.streams
        m = b - a
        src, scale = grad(a, b)
        with torch.cuda.stream(up):
            if freed is not None:
                up.wait_event(freed)
            for n in NAMES:
                s[n][:m].copy_(getattr(states, n)[a:b], non_blocking=True)
            if on_device is None:  # the fp32 gradient, or the 16-bit one rebuilt below
                s["grad" if scale is None else "grad16"][:m].copy_(src, non_blocking=True)
        if work is not None:
            work.wait_stream(up)
        with torch.cuda.stream(work):
            if scale is not None:  # the host's lazy gradient, rebuilt the same way (kernels/cpu.scaled_copy)
                s["grad"][:m].copy_(s["grad16"][:m] if on_device is None else on_device)
                s["grad"][:m].mul_(scale)
            if on_device is not None and work is not None:
                on_device.record_stream(work)  # its memory is not reused before this stream has read it
            for lo, hi, g in pieces(a, b):
                h, sl = hyper[g], slice(lo - a, hi - a)
                adamw_step(s["master"][sl], s["grad"][sl], s["exp_avg"][sl], s["exp_avg_sq"][sl],
                           s["out"][sl] if out is not None else None, lr=args["lrs"][g : g + 1],
                           step=args["step"], coef=args["coef"], skip=args["skip"], beta1=h["beta1"],
                           beta2=h["beta2"], eps=h["eps"], weight_decay=h["weight_decay"],
                           decoupled=args["decoupled"])
        if down is not None:
            down.wait_stream(work)
        with torch.cuda.stream(down):
            for n in NAMES:
                getattr(states, n)[a:b].copy_(s[n][:m], non_blocking=True)
            if out is not None:
                out[a:b].copy_(s["out"][:m], non_blocking=True)
            # blocking: a thread that waits for it (the claims above) sleeps instead of spinning on a core
            ev = torch.cuda.Event(blocking=True) if down is not None else None
            if ev is not None:
                ev.record(down)
        self.landed.append((a, b, ev))
        return ev

    def poll(self, order: InOrder) -> None:
        """Publish the chunks that have landed (without blocking)."""
        while self._taken < len(self.landed):
            a, b, ev = self.landed[self._taken]
            if ev is not None and not ev.query():
                return
            self._taken += 1
            order.done(a, b)

    def finish(self, order: InOrder) -> float:
        """Wait for every chunk, publishing each as it lands; the seconds since the update was queued."""
        assert self.thread is not None
        self.thread.join()
        if self.error is not None:
            raise self.error
        for a, b, ev in self.landed[self._taken :]:
            if ev is not None:
                ev.synchronize()
            order.done(a, b)
        self._taken = len(self.landed)
        self.args = {}  # every chunk has landed: the update kernels are done with them
        return time.perf_counter() - self.started
