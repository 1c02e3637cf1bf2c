"""OOM-safe searches: the largest batch per GPU, or the largest model, that still trains.

`fits(x)` runs a short training in a fresh launch and says whether it finished without running out
of memory; nothing from a failed try survives into the next one. Memory use grows with the batch
and the model size, so doubling and then bisecting finds the boundary in O(log) tries.
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

Result = TypeVar("Result")


def largest_fitting(fits: Callable[[int], bool], start: int, maximum: int, multiple_of: int = 1) -> int | None:
    """The largest b in [start, maximum] with fits(b), or None if `start` already fails.

    With `multiple_of` m > 1 only multiples of m are tried (start rounded up, maximum down): a big
    model's tries cost a launch each, and a batch of 8k is what users pick anyway.
    """
    if multiple_of > 1:
        lo_k, hi_k = -(-start // multiple_of), maximum // multiple_of
        if hi_k < lo_k:
            return None
        k = largest_fitting(lambda k: fits(k * multiple_of), lo_k, hi_k)
        return None if k is None else k * multiple_of
    if not fits(start):
        return None
    lo, hi = start, None
    while hi is None:
        nxt = min(lo * 2, maximum)
        if nxt == lo:
            return lo  # the cap fits
        if fits(nxt):
            lo = nxt
        else:
            hi = nxt
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def largest_fitting_value(fits: Callable[[int], bool], values: Sequence[int]) -> int | None:
    """The largest of the sorted `values` with fits(value) (bisection), or None if none fits."""
    ordered = sorted(values)
    lo, hi = -1, len(ordered)  # invariant: ordered[lo] fits (or lo = -1), ordered[hi] fails (or hi = len)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(ordered[mid]):
            lo = mid
        else:
            hi = mid
    return ordered[lo] if lo >= 0 else None


def train_stepping_down(train: Callable[[int], Result | None], batch: int, lowest: int, step: int = 1,
                        downs: int = 0) -> tuple[int, Result | None]:
    """(the batch, train(batch)) for the first batch that trains, from `batch` down by `step` at most `downs`
    times and never below `lowest` (`batch` itself is always tried); train returns None when out of memory.
    (the last batch tried, None) if none trains."""
    tried = batch
    for tried in range(batch, min(batch, max(lowest, batch - downs * step)) - 1, -step):
        result = train(tried)
        if result is not None:
            return tried, result
    return tried, None
