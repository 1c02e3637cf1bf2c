"""Host AdamW started during backward, exact (`zero_core.overlap_host_update`: the fraction of the host
share that may be updated this way).

In the pass that ends at the optimizer step, as soon as a bucket's gradient shard is final (landed in
host memory, and folded under accumulation), the host folding thread updates that bucket's states, as
if the step will apply unclipped: coefficient 1, this step's learning rate and step count. Whether
that guess holds is known only once every shard of every rank is in (the global norm and the
non-finite flag), so the pre-update master and moments of each speculated piece are copied aside
first. At the step:

    non-finite gradients           every speculated range is restored: the step is skipped, as before
    clipping engages (coef < 1)    restored, then updated with the coefficient with the rest
    the step's lr is another one   restored, then updated at that lr (a loop set it after backward)
    otherwise                      kept; the step updates only what was not speculated

After a step whose clip engaged, nothing is speculated until a step applies unclipped (host_adam.py): the
guess would most likely fail again and cost its update twice. Shards whose turn on the fold thread comes after
backward has ended are left to the step: nothing is left to hide their update behind, and the step's runs in
partition order, overlapping the next forward; a shard being updated when backward ends stops at its next
piece. On CUDA backward ends when the device has run it (host_folder.BackwardEnd).

Each element sees exactly the update the non-overlapped step would give it (the fused kernel is
element-wise, and ranges start at bucket-shard boundaries, multiples of the layout's alignment), so
the result is bitwise the same. The copies cost 12 bytes of host memory per speculated element, which
is why the fraction is bounded; they are allocated at the first speculating pass, when everything else is
in place, and never beyond what the host has left (MemAvailable, shared by the node's ranks, less a margin):
a fraction that would not fit is lowered, with one line saying so, instead of the kernel killing the run.
The 16-bit conversion and the upload of speculated ranges still happen in the step, in partition order (the
uploader gathers buckets in that order).
"""

from __future__ import annotations

from typing import Callable

import torch

from .. import comm
from ..meminfo import meminfo_bytes
from .nvme_states import ALIGN
from .states import NAMES

Range = tuple[int, int]
BACKUP_BYTES_PER_ELEMENT = 12  # fp32 master and both moments
HOST_MARGIN_BYTES = 4 << 30  # left free: page cache, pinned-buffer churn and the allocator's slack


def available_host_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (None where it cannot be read)."""
    return meminfo_bytes().get("MemAvailable")


def elements_that_fit(wanted: int, available: int | None, ranks_on_node: int) -> int:
    """How many of `wanted` speculated elements' copies fit in this rank's part of `available` host memory."""
    if available is None:
        return wanted
    room = (available // max(ranks_on_node, 1) - HOST_MARGIN_BYTES) // BACKUP_BYTES_PER_ELEMENT
    return min(wanted, max(0, room // ALIGN * ALIGN))


class SpeculativeUpdates:
    def __init__(self, states, budget_numel: int) -> None:
        self.states, self.budget = states, budget_numel
        self._backup: dict[str, torch.Tensor] = {}
        self.ranges: list[tuple[int, int, int]] = []  # (lo, hi, position in the backup)
        self._used = self._reserved = 0

    def begin(self) -> None:
        """A new final pass: nothing speculated yet (the last step settled what was)."""
        assert not self.ranges, "speculated ranges left unsettled"
        self._used = self._reserved = 0
        if not self._backup and self.budget:
            self._allocate()

    def _allocate(self) -> None:
        fit = elements_that_fit(self.budget, available_host_bytes(), comm.local_world_size())
        if fit < self.budget and comm.rank() == 0:
            print(f"zero_core: overlap_host_update lowered to {fit:,} of {self.budget:,} elements: their copies need "
                  f"{BACKUP_BYTES_PER_ELEMENT} bytes each and the host has too little memory left", flush=True)
        self.budget = fit
        self._backup = {n: comm.host_buffer(fit, torch.float32, pin=False) for n in NAMES} if fit else {}

    def release(self) -> None:
        """Free the copies and speculate no more (the optimizer is being replaced, ratio "auto")."""
        assert not self.ranges, "speculated ranges left unsettled"
        self._backup, self.budget = {}, 0

    def reserve(self, numel: int) -> bool:
        """Room for `numel` more elements in the copies (taken now, in submission order)?"""
        if self._reserved + numel > self.budget:
            return False
        self._reserved += numel
        return True

    def update(self, lo: int, hi: int, adam: Callable[[int, int], None], piece: int,
               stop: Callable[[], bool] = lambda: False) -> None:
        """Per `piece` elements of [lo, hi): copy every state aside, then run `adam(a, b)` (coefficient 1) over
        them while they are still in cache (one pass over the whole range first would read the states twice
        from memory). Once `stop()` says so, the pieces not yet begun are left to the step (`piece` is a
        multiple of the alignment, so the range speculated still ends on an aligned element)."""
        pos, end = self._used, lo
        for a in range(lo, hi, piece):
            if stop():
                break
            end = min(hi, a + piece)
            for n in NAMES:
                self._backup[n][pos + a - lo : pos + end - lo].copy_(getattr(self.states, n)[a:end])
            adam(a, end)
        if end > lo:
            self._used += end - lo
            self.ranges.append((lo, end, pos))

    def settle(self, keep: bool) -> list[Range]:
        """The step's verdict: `keep` the speculated updates (returned, so the step skips them) or put the
        states back as they were (the step then redoes or skips everything)."""
        ranges, self.ranges = self.ranges, []
        if keep:
            return [(lo, hi) for lo, hi, _ in ranges]
        for lo, hi, pos in ranges:
            for n in NAMES:
                getattr(self.states, n)[lo:hi].copy_(self._backup[n][pos : pos + hi - lo])
        return []


def without(pieces: list[tuple[int, int, int]], done: list[Range]) -> list[tuple[int, int, int]]:
    """`pieces` ((lo, hi, group) runs) minus the `done` ranges."""
    out = []
    for lo, hi, g in pieces:
        cuts = sorted((max(lo, a), min(hi, b)) for a, b in done if a < hi and b > lo)
        at = lo
        for a, b in cuts:
            if at < a:
                out.append((at, a, g))
            at = max(at, b)
        if at < hi:
            out.append((at, hi, g))
    return out
