"""Whether a DCP tensor's chunks cover it exactly once: no element left out, none covered twice.

DCP's reader fills a tensor made with torch.empty from its chunks, so an element no chunk covers would be
uninitialised memory in the output, and overlapping chunks mean the metadata is not what dcp.save writes.

The check runs in time near-linear in the number of chunks, whatever their layout (a crafted `.metadata` may list
hundreds of thousands of one-element chunks). Chunks lie inside the tensor (checked first) and are boxes
[offset, offset + size) on the tensor's index grid. Two facts decide exactness without comparing chunks pairwise:

  - counting: the chunks' element counts must add up to the tensor's;
  - corner parity: on the tensor's grid, the indicator of [a, b) along one dimension is [x >= a] - [x >= b],
    and [x >= b] vanishes there when b is the dimension's end. So, modulo 2, a chunk's indicator is the sum of
    the orthants [x >= c] over its corners c that lie inside the tensor (per dimension its offset, and its end
    unless that is the tensor's end). The orthants of distinct points are independent, so the chunks cover
    every element an odd number of times exactly when their inside corners, each counted modulo 2, reduce to
    the tensor's origin alone.

Odd everywhere and the counts adding up leaves only "exactly once". A chunk has 2**k inside corners, k the
dimensions it splits short of the end, so a layout split along very many dimensions at once (more corners
than CORNER_BUDGET allows) is checked by a sweep instead, which compares chunks that share a slab.
"""

from __future__ import annotations

import itertools
import math

Box = tuple[tuple[int, ...], tuple[int, ...]]  # a chunk's (offsets, sizes)


def corner_budget(chunks: int) -> int:
    """The most inside corners the parity check enumerates for `chunks` chunks (16 a chunk: 4 split dimensions)."""
    return 16 * chunks + (1 << 16)


def tiling_problem(size: tuple[int, ...], boxes: list[Box], budget: int | None = None) -> str | None:
    """How the chunks fail to cover a tensor of `size` exactly once (as a phrase about them), or None.
    `budget`: the most corners enumerated before the sweep decides instead (default corner_budget)."""
    if any(o + n > d for offsets, sizes in boxes for o, n, d in zip(offsets, sizes, size)):
        return "reach past its size"
    boxes = [(offsets, sizes) for offsets, sizes in boxes if math.prod(sizes)]  # chunks of no elements hold none
    covered, elements = sum(math.prod(sizes) for _, sizes in boxes), math.prod(size)
    if covered > elements:
        return "overlap"
    if covered < elements:
        return f"hold {covered:,} of its {elements:,} elements, leaving a gap"
    if not boxes:  # a tensor of no elements and no chunk holding any
        return None
    odd = odd_corners(size, boxes, corner_budget(len(boxes)) if budget is None else budget)
    if odd is None:
        return "overlap" if sweep_overlaps(size, boxes) else None
    # the counts add up, so anything but a tiling covers some element twice (and leaves another out)
    return None if odd == {(0,) * len(size)} else "overlap"


def odd_corners(size: tuple[int, ...], boxes: list[Box], budget: int) -> set[tuple[int, ...]] | None:
    """The inside corners of the chunks that occur an odd number of times; None if there are more than `budget`."""
    choices = [
        tuple((o,) if o + n == d else (o, o + n) for o, n, d in zip(offsets, sizes, size)) for offsets, sizes in boxes
    ]
    if sum(1 << sum(len(c) == 2 for c in box) for box in choices) > budget:
        return None
    odd: set[tuple[int, ...]] = set()
    for box in choices:  # one chunk's corners are distinct: the symmetric difference toggles each once
        odd.symmetric_difference_update(itertools.product(*box))
    return odd


def sweep_overlaps(size: tuple[int, ...], boxes: list[Box]) -> bool:
    """Whether two chunks overlap: swept along the dimension the chunks split most, each one compared with the
    chunks still open there (quadratic when many are open at once; only for layouts past the corner budget)."""
    # a trailing dimension of 1 gives a 0-d tensor's chunk a dimension to sweep
    boxes = [((*offsets, 0), (*sizes, 1)) for offsets, sizes in boxes]
    dim = max(range(len(size) + 1), key=lambda d: len({offsets[d] for offsets, _ in boxes}))
    still_open: list[Box] = []
    for offsets, sizes in sorted(boxes, key=lambda box: box[0][dim]):
        still_open = [(o, n) for o, n in still_open if o[dim] + n[dim] > offsets[dim]]
        if any(all(a < b + m and b < a + n for a, n, b, m in zip(offsets, sizes, other, other_sizes))
               for other, other_sizes in still_open):
            return True
        still_open.append((offsets, sizes))
    return False
