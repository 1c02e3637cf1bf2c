"""The optimizer-offload step: AdamW on the host in cache-sized chunks, each chunk's 16-bit weights sent
to the GPU as soon as they exist.

Per chunk of `HOST_CHUNK_NUMEL` elements: torch's fused CPU AdamW, then the 16-bit conversion of the
chunk just written (still in cache), then (on CUDA) that chunk's host-to-device copy on a copy stream,
which runs while the next chunk is updated; the engine waits only for the last copy. With NVMe the
chunks come from `NvmeStates.stream()`, which reads ahead and writes back around this loop. With
`zero_core.offload_stream_fraction` every few chunks of the share are updated on the GPU meanwhile
(streamed_update.py), which then takes the host's last chunks while the host works through the first ones
(chunk_claims.py); chunks are published in partition order whichever side finishes first.

Gradients: each reduced shard lands in a pinned staging buffer (communication dtype). When the pass is the last
before the update and does not accumulate (no gradient accumulation, or stage 1) the host does not fold at all: the
shard's sum of squares and non-finite flag are taken where it was reduced (on the GPU, a fraction of a millisecond),
and the step rebuilds each fp32 gradient chunk from staging right before its Adam: no fp32 gradient partition is
written, read back or allocated. Otherwise (gradient accumulation at stages 2-3) the host folds shards into the fp32
partition in cache-sized pieces on its own thread while backward goes on.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from .. import comm
from ..kernels import cpu as host_kernels
from ..step_timer import StepBreakdown
from .base import Output, PartitionOptimizer, Publish
from .held_grads import HeldGrads
from .host_folder import BackwardEnd, HostFolder
from .param_groups import merged_runs
from .shard_norms import ShardNorms
from .nvme_states import ALIGN, chunk_numel_from_env
from .chunk_claims import ChunkClaims, host_chunks
from .speculative import SpeculativeUpdates, without
from .states import TensorStates
from .streamed_update import InOrder, StreamedUpdate, streamed_chunks

# 4 Mi elements (16 MiB per fp32 state): with 8-16 threads per rank each thread's slice (256-512 Ki elements) is far
# above OpenMP's fork/join cost per op, and its fp32 master is still in L2/L3 when the 16-bit conversion reads it; an
# 8 MiB bf16 copy runs at full PCIe bandwidth. On 2x H200 (GPT-2 XL, stage 2, 16 threads per rank) 4 Mi ran 635-659
# ms/step, 1 Mi 666-720 and 256 Ki 920. A multiple of ALIGN, so chunk boundaries never change which elements the fused
# kernel vectorises (bitwise the same as one call). ZERO_CORE_HOST_CHUNK_NUMEL overrides it (tuning, tests).
HOST_CHUNK_NUMEL = 4 << 20
# The fold (gradient accumulation) works on pieces of the same size, not tunable: they decide the norm's sum order.
FOLD_CHUNK_NUMEL = HOST_CHUNK_NUMEL


class HostAdamW(PartitionOptimizer):
    """AdamW whose states live in host memory or on NVMe (`states`), updated chunk by chunk on the host."""

    on_host = True
    adam_key = "cpu_adam"  # the breakdown's name for the update's time (a delayed update overlaps: another one)

    def __init__(self, states, *, comm_dtype: torch.dtype, breakdown: StepBreakdown | None = None,
                 overlap_fraction: float = 0.0, stream_fraction: float = 0.0, hold_grads: bool = False,
                 balance: bool = True, staging: torch.Tensor | None = None, **kw) -> None:
        super().__init__(states, **kw)
        if not host_kernels.available():
            raise ValueError(
                "optimizer offload needs torch's fused CPU Adam (torch._fused_adamw_, torch >= 2.4); upgrade torch"
            )
        self.chunk = chunk_numel_from_env(HOST_CHUNK_NUMEL, "ZERO_CORE_HOST_CHUNK_NUMEL")
        assert self.chunk % ALIGN == 0
        n = states.numel
        # reduced shards land here (D2H target); given: the tail of a replaced optimizer's (ratio "auto")
        self.staging = comm.host_buffer(n, comm_dtype, pin=True) if staging is None else staging
        assert self.staging.numel() == n and self.staging.dtype == comm_dtype
        self.grad: torch.Tensor | None = None  # fp32 host gradients, allocated by the first fold that keeps them
        self.breakdown = breakdown or StepBreakdown(torch.device("cpu"), enabled=False)
        self._step_scratch = torch.empty(min(n, self.chunk), dtype=torch.float32)
        self.lazy = False  # this pass's gradient is staging * scale, rebuilt chunk by chunk in the step
        self._lazy_scale = 1.0
        self._norms = ShardNorms(self.comm_device)  # lazy passes' statistics, where the shards are reduced
        self._folder = HostFolder()  # folds shards on its own thread while backward goes on
        self._flat_runs = merged_runs(self.runs)
        # updates started during backward (speculative.py); states on NVMe are streamed, never updated in place
        budget = int(overlap_fraction * n) if isinstance(states, TensorStates) else 0
        self.speculative = SpeculativeUpdates(states, budget)
        self._speculating = False
        self._last_clipped = False  # the last applied step's clipping engaged: the next guess would fail too
        self.backward_end = BackwardEnd(self.comm_device)
        self.counts: Callable[[], torch.Tensor] = lambda: self.applied  # the updates applied so far (a composite's)
        self.run_update: Callable[[Callable[[], None]], None] = lambda update: update()  # here, by default
        self._spec_hyper: list[dict] | None = None
        # chunks updated on the GPU, their states streamed (streamed_update.py); never speculated. A streamed chunk
        # is a whole number of host chunks (ZERO_CORE_STREAM_CHUNK_NUMEL, rounded up to one: tuning)
        step = -(-chunk_numel_from_env(self.chunk, "ZERO_CORE_STREAM_CHUNK_NUMEL") // self.chunk) * self.chunk
        ranges = streamed_chunks(n, stream_fraction, step) if isinstance(states, TensorStates) else []
        self.streamed = StreamedUpdate(ranges, self.comm_device, balance) if ranges else None
        self.streamed_ranges = ranges
        self._streamed_starts = {c for a, b in ranges for c in range(a, b, self.chunk)}  # host chunks it takes
        self.held = HeldGrads(ranges, hold_grads)  # their gradients kept on the device from backward to the update
        self.balance, self.taken_by_device = balance, []  # GPU takes the host's last chunks: which (chunk_claims.py)
        self._coef = 1.0

    # -- gradients ---------------------------------------------------------------------------------
    def begin_pass(self, scale: torch.Tensor, accumulate: bool, final: bool) -> None:
        """Lazy when the step follows and nothing accumulates: statistics come from each shard where it
        was reduced, and the step rebuilds gradients as staging * scale (no fp32 gradient partition)."""
        super().begin_pass(scale, accumulate, final)
        self.lazy = final and not accumulate
        self._lazy_scale = float(scale[0])
        self.held.begin(self.lazy)
        self._norms.begin(self._lazy_scale)
        # a host schedule (lr_at None) writes the lr only at the step: nothing can start before it. After a
        # clipped step the norm is most likely above the threshold again, and an update started as unclipped
        # would only be undone and redone (its cost twice over): the host update then waits for the step.
        self._speculating = final and self.speculative.budget > 0 and self.lr_at is not None and not self._last_clipped
        self._spec_hyper = None
        self.backward_end.reset()
        if self._speculating:
            self.speculative.begin()

    def receive(self, reduced: torch.Tensor, offset: int) -> None:
        """Copy the shard into pinned staging (on the caller's stream, the reduce stream on CUDA); the
        folding thread takes it once the copy landed."""
        numel, scale, accumulate = reduced.numel(), self.scale, self.accumulate
        assert scale is not None, "receive() outside a reduction pass"
        if self.lazy:
            self.reduced_stats(reduced)
        start = self.breakdown.event()
        for lo, hi in self.held.take(reduced, offset):  # the streamed chunks' parts may stay on the device
            self.staging[lo:hi].copy_(reduced[lo - offset : hi - offset], non_blocking=True)
        landed = None
        if reduced.is_cuda:
            landed = torch.cuda.Event(enable_timing=self.breakdown.cuda)
            landed.record()
            self.breakdown.span("d2h", start, landed if self.breakdown.cuda else None)
        self._folder.submit(landed, self._fold_job(offset, numel, scale, accumulate))

    def _fold_job(self, offset: int, numel: int, scale: torch.Tensor, accumulate: bool) -> Callable[[], None]:
        lazy, ours = self.lazy, []
        if self._speculating:  # the shard's host part: streamed chunks are the GPU's, never speculated
            ours = [(a, b) for a, b, _ in without([(offset, offset + numel, 0)], self.streamed_ranges)]
        speculate = self._speculating and self.speculative.reserve(sum(b - a for a, b in ours))

        def job() -> None:
            if not lazy:  # else the step rebuilds this shard's gradient from staging
                with self.breakdown.host("host_fold"):
                    self.fold(offset, numel, scale, accumulate)
            # the shard is final: update it now, undone at the step if it must be; once backward has ended
            # the step's own update (in partition order, overlapping the next forward) is the better place
            if speculate and not self.backward_end():
                with self.breakdown.host("overlapped_cpu_adam"):
                    for a, b in ours:
                        self.speculative.update(a, b, self._speculative_adam, self.chunk, self.backward_end)

        return job

    def _speculative_adam(self, lo: int, hi: int) -> None:
        """AdamW over [lo, hi) as the step would apply it unclipped (on the folding thread)."""
        if self._spec_hyper is None:
            applied = self.counts()
            lr = self.lr_at(applied)  # this step's lr: the schedule at the updates applied so far
            self._spec_step = (applied + 1).cpu()  # the step count the update will have
            self._spec_hyper = self._hyper(lr.cpu())
        v = {n: getattr(self.states, n) for n in ("master", "exp_avg", "exp_avg_sq")}
        self._adam_pieces(v, 0, self._runs_between(lo, hi), self._spec_hyper, self._spec_step)

    def end_pass(self) -> None:
        self.backward_end.mark()  # jobs still queued once it has run fold only: nothing hides their updates
        with self.breakdown.host("fold_wait"):
            self._folder.wait()

    def reduced_stats(self, reduced: torch.Tensor) -> None:
        """Lazy passes: count the shard in the pass's norm and non-finite statistics, on reduced's device."""
        self._norms.add(reduced)

    def fold(self, start: int, numel: int, scale: torch.Tensor, accumulate: bool) -> None:
        """Non-lazy passes (the fold thread, in order): fold staging[start:start+numel] into the fp32
        gradient partition and the norm statistics, in cache-sized pieces."""
        if self.grad is None:
            self.grad = comm.host_buffer(self.states.numel, torch.float32, pin=self.streamed is not None)
        src = self.staging[start : start + numel]
        for a in range(0, numel, FOLD_CHUNK_NUMEL):
            b = min(numel, a + FOLD_CHUNK_NUMEL)
            host_kernels.reduce_epilogue(
                src[a:b], self.grad[start + a : start + b], scale, accumulate, self.sumsq, self.nonfinite
            )

    def _local_stats(self) -> torch.Tensor:
        host = torch.cat([self.sumsq, self.nonfinite.float()])
        lazy = self._norms.stats()
        return host.to(lazy.device) + lazy

    def _grad(self, a: int, b: int, out: torch.Tensor | None = None, coef: float = 1.0) -> torch.Tensor:
        """fp32 gradient of [a, b), times the clip coefficient `coef` (a second rounding, as on the device): a view
        of the folded partition, or rebuilt from staging into `out` (lazy; default: the step's chunk scratch)."""
        g = self._step_scratch[: b - a] if out is None else out
        if not self.lazy:
            assert self.grad is not None
            return self.grad[a:b] if coef == 1.0 else torch.mul(self.grad[a:b], coef, out=g)
        scale = self._lazy_scale
        if coef != 1.0 and math.frexp(scale)[0] == 0.5:  # a power of two: scaling by it rounds nothing, so one
            scale, coef = scale * coef, 1.0  # pass with the product gives the bits of the two multiplications
        host_kernels.scaled_copy(self.staging[a:b], g, scale)
        return g if coef == 1.0 else g.mul_(coef)

    def _grad_source(self, a: int, b: int) -> tuple[torch.Tensor, float | None]:
        """What the streamed update uploads for [a, b): staging and its scale (lazy), or the fp32 gradient."""
        return (self.staging[a:b], self._lazy_scale) if self.lazy else (self.grad[a:b], None)  # type: ignore[index]

    def gradient_of(self, lo: int, hi: int) -> torch.Tensor:
        if not self.lazy and self.grad is None:  # nothing folded yet
            return torch.zeros(hi - lo, dtype=torch.float32)
        g = torch.empty(hi - lo, dtype=torch.float32)
        if not self.lazy:
            return self._grad(lo, hi, g)
        host_kernels.scaled_copy(self.held.staged(self.staging, lo, hi), g, self._lazy_scale)  # held parts too
        return g

    # -- the update --------------------------------------------------------------------------------
    def _hyper(self, lr: torch.Tensor) -> list[dict]:
        """The fused kernel's arguments per optimizer group (the clip coefficient: `_adam_pieces`)."""
        return [dict(lr=float(lr[g]), beta1=h.beta1, beta2=h.beta2, weight_decay=h.weight_decay, eps=h.eps,
                     amsgrad=False, maximize=False, grad_scale=None, found_inf=None)
                for g, h in enumerate(self.groups)]

    def _adam_pieces(self, v: dict[str, torch.Tensor], lo: int, pieces, hyper: list[dict], step: torch.Tensor,
                     coef: float = 1.0) -> None:
        """One fused call per (a, b, group) piece; `v` holds the states from partition element `lo` on. Clipped,
        the gradient is grad * coef as on the device (fused Adam's grad_scale would divide by 1 / coef)."""
        fused = torch._fused_adamw_ if self.decoupled else torch._fused_adam_
        for ra, rb, g in pieces:
            sl = slice(ra - lo, rb - lo)
            grad = self._grad(ra, rb, coef=coef)  # pieces lie within one chunk: the step's scratch holds them
            fused([v["master"][sl]], [grad], [v["exp_avg"][sl]], [v["exp_avg_sq"][sl]], [], [step], **hyper[g])

    def _update(self, coef: torch.Tensor, out: Output, publish: Publish | None,
                after_segment: Callable[[int], None] | None = None) -> None:  # buckets are gathered through `publish`
        c = float(coef[0])
        skip = int(self.overflow[0]) != 0
        hyper = None if skip else self._hyper(self.lr)
        # what backward already updated for good: unclipped, and at this step's values (a training loop may set them
        # between backward and step)
        keep = hyper is not None and c == 1.0 and self._speculated_at(hyper)
        done = self.speculative.settle(keep=keep)
        if hyper is None:
            self.held.clear()
            return  # skipped: nothing changes, nothing to send (and says nothing of the next norm)
        self._last_clipped, self._coef = c < 1.0, c
        assert out is None or isinstance(out, torch.Tensor), "the host update writes one flat 16-bit partition"
        self.run_update(lambda: self._chunks(out, publish, done, hyper))

    def _speculated_at(self, hyper: list[dict]) -> bool:
        """Whether this pass's speculated updates (if any) used `hyper`'s values (a loop may write its groups')."""
        values = lambda hs: [[h[k] for k in ("lr", "beta1", "beta2", "eps", "weight_decay")] for h in hs]  # noqa: E731
        return self._spec_hyper is None or values(self._spec_hyper) == values(hyper)

    def _chunks(self, out: Output, publish: Publish | None, done: list[tuple[int, int]], hyper: list[dict]) -> None:
        """The chunked update, in partition order (on the training thread, or the stage's update thread)."""
        waited = getattr(self.states, "wait_seconds", 0.0)
        order = InOrder(publish)  # a chunk the host finishes before a streamed one ahead of it waits for it
        with self.breakdown.host(self.adam_key):
            # the host's chunks the GPU may take from the back once its own are queued (not if any was speculated:
            # a chunk partly updated during backward is the host's to finish)
            shared = self.streamed is not None and self.balance and not done
            claims = ChunkClaims.of(self.states.numel, self.chunk, self._streamed_starts) if shared else None
            self.taken_by_device = [] if claims is None else claims.from_back  # filled as the GPU takes them
            streamed = None if self.streamed is None else self.streamed.start(
                self.states, self._grad_source, out, self._runs_between, hyper, self._coef, self.applied,
                self.decoupled, held=lambda a, b: self.held.pop(a, b, self.staging), held_ready=self.held.ready,
                claims=None if claims is None else (claims, self.chunk))
            for lo, hi, v, a in host_chunks(self.states.stream(), self.chunk, self._streamed_starts, claims):
                b = min(hi, a + self.chunk)
                self._adam_pieces(v, lo, without(self._runs_between(a, b), done), hyper, self.applied, self._coef)
                if out is not None:
                    out[a:b].copy_(v["master"][a - lo : b - lo])  # the 16-bit copy while it is in cache
                order.done(a, b)
                if streamed is not None:
                    streamed.poll(order)
            if streamed is not None:
                with self.breakdown.host("stream_wait"):
                    elapsed = streamed.finish(order)
                self.breakdown.add("streamed_adam", elapsed)
        self.breakdown.add("nvme_wait", getattr(self.states, "wait_seconds", 0.0) - waited)

    def undo_speculation(self) -> None:
        self._folder.wait()  # a shard still being updated (end_pass has normally waited already)
        self.speculative.settle(keep=False)

    def run_host_update_with(self, launch: Callable[[Callable[[], None]], None]) -> bool:
        """Let the stage run the chunked update (e.g. on its own thread, stages/host_step_overlap.py)."""
        self.run_update, self.adam_key = launch, "overlapped_cpu_adam"
        return True

    def _runs_between(self, a: int, b: int) -> list[tuple[int, int, int]]:
        """The pieces of [a, b) by optimizer group (run boundaries are multiples of the layout's alignment, so
        splitting a chunk there keeps the fused kernel's results bitwise the same)."""
        return [(max(a, lo), min(b, hi), g) for lo, hi, g in self._flat_runs if lo < b and hi > a]

    def close(self) -> None:
        self._folder.close()
        if self.streamed is not None:
            self.streamed.close()
        super().close()
