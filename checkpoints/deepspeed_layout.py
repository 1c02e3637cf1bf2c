"""Where each parameter's fp32 master lives in a DeepSpeed ZeRO checkpoint's per-rank flat partitions.

A rank's optimizer file holds one flat fp32 tensor per param group. We address a rank's tensors as
if they were laid end to end ("rank offset"), and describe each parameter as the ordered list of
pieces (rank, rank offset, numel) whose concatenation is the flattened parameter.

- ZeRO-1/2: each group is one flat buffer (params in `param_shapes` order, each followed by its
  `param_alignment_paddings` entry when present, the whole padded to a multiple of 2 * world size)
  cut into equal per-rank partitions; the saved partitions drop the padding at the group's tail.
  DeepSpeed also saves `param_slice_mappings`: per rank, per group, each parameter's fragment
  (numel, start within that rank's partition). We use those when present and the arithmetic
  otherwise; the tests check that both agree on every fixture.
- ZeRO-3: every parameter is split on its own into ceil(numel / world) elements per rank (the last
  rank padded), and a rank's groups hold its parameter partitions back to back in `param_shapes` order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .deepspeed_pickle import bad_field, checked_number, shown
from .source import CheckpointError

MAX_NUMEL = 2**53  # elements in one flat partition: exact as floats, far past any run


@dataclass(frozen=True)
class Piece:
    """`numel` elements of a parameter, at `start` in rank `rank`'s partitions laid end to end."""

    rank: int
    start: int
    numel: int


def _numel(shape: Sequence[int]) -> int:
    return math.prod(int(d) for d in shape)


def _bases(sizes: Sequence[int]) -> list[int]:
    """Rank offset where each group's partition begins."""
    out, acc = [], 0
    for s in sizes:
        out.append(acc)
        acc += s
    return out


def checked_mappings(path: Any, mappings: Any, groups: int) -> list[Mapping[str, Any]]:
    """One rank's `param_slice_mappings` read from `path`: `groups` dicts of {name: address}, each address's
    `numel` and `start` integers >= 0; else one CheckpointError line naming the file and the field."""
    if not isinstance(mappings, (list, tuple)) or len(mappings) != groups:
        raise bad_field(path, "param_slice_mappings", mappings, f"a list of {groups} dicts (one per param group)")
    for g, names in enumerate(mappings):
        if not isinstance(names, dict) or not all(isinstance(n, str) for n in names):
            raise bad_field(path, f"param_slice_mappings[{g}]", names, "a dict of parameter names")
        for name, frag in names.items():
            for key in ("numel", "start"):
                where = f"param_slice_mappings[{g}][{shown(name)}].{key}"
                checked_number(path, where, getattr(frag, key, None), 0, MAX_NUMEL)
    return list(mappings)


def checked_paddings(path: Any, paddings: Any, shapes: Sequence[Mapping[str, Any]]) -> list[list[int]] | None:
    """`param_alignment_paddings` read from `path`: None, or per param group one integer >= 0 per parameter."""
    if paddings is None:
        return None
    if not isinstance(paddings, (list, tuple)) or len(paddings) != len(shapes):
        raise bad_field(path, "param_alignment_paddings", paddings, f"a list of {len(shapes)} lists")
    for g, (pads, names) in enumerate(zip(paddings, shapes)):
        if not isinstance(pads, (list, tuple)) or len(pads) != len(names):
            raise bad_field(path, f"param_alignment_paddings[{g}]", pads, f"a list of {len(names)} integers")
        for i, pad in enumerate(pads):
            checked_number(path, f"param_alignment_paddings[{g}][{i}]", pad, 0, MAX_NUMEL)
    return [list(pads) for pads in paddings]


def stage12_from_mappings(
    mappings: Sequence[Sequence[Mapping[str, Any]]], group_sizes: Sequence[Sequence[int]]
) -> dict[str, list[Piece]]:
    """Pieces from `param_slice_mappings` (`mappings[rank][group][name]` has `.numel` and `.start`)."""
    pieces: dict[str, list[Piece]] = {}
    for rank, groups in enumerate(mappings):
        bases = _bases(group_sizes[rank])
        for g, names in enumerate(groups):
            for name, frag in names.items():
                pieces.setdefault(name, []).append(Piece(rank, bases[g] + int(frag.start), int(frag.numel)))
    return pieces


def stage12_from_offsets(
    param_shapes: Sequence[Mapping[str, Sequence[int]]],
    alignment_paddings: Sequence[Sequence[int]] | None,
    group_sizes: Sequence[Sequence[int]],
) -> dict[str, list[Piece]]:
    """Pieces computed from the shapes, the per-parameter paddings and the saved partition sizes."""
    world = len(group_sizes)
    pieces: dict[str, list[Piece]] = {}
    bases = [_bases(sizes) for sizes in group_sizes]
    for g, shapes in enumerate(param_shapes):
        part = group_sizes[0][g]  # rank 0 keeps a full partition unless the data fits in it entirely
        pads = alignment_paddings[g] if alignment_paddings else [0] * len(shapes)
        offset = 0
        for (name, shape), pad in zip(shapes.items(), pads):
            n = _numel(shape)
            found = []
            for r in range(world):
                lo, hi = max(offset, r * part), min(offset + n, (r + 1) * part)
                if lo < hi:
                    found.append(Piece(r, bases[r][g] + lo - r * part, hi - lo))
            pieces[name] = found
            offset += n + int(pad)
    return pieces


def stage3_pieces(param_shapes: Sequence[Mapping[str, Sequence[int]]], world: int) -> dict[str, list[Piece]]:
    """ZeRO-3 pieces: each parameter padded to a multiple of `world` and split evenly."""
    pieces: dict[str, list[Piece]] = {}
    offset = 0
    for shapes in param_shapes:
        for name, shape in shapes.items():
            n = _numel(shape)
            part = math.ceil(n / world)
            pieces[name] = [Piece(r, offset, min(part, n - r * part)) for r in range(world) if n - r * part > 0]
            offset += part
    return pieces


def check_pieces(
    pieces: Mapping[str, list[Piece]], shapes: Mapping[str, Sequence[int]], rank_sizes: Sequence[int], where: str
) -> None:
    """Every parameter fully covered and every piece inside its rank's saved partitions, else CheckpointError."""
    for name, shape in shapes.items():
        got = sum(p.numel for p in pieces.get(name, []))
        if got != _numel(shape):
            raise CheckpointError(
                f"{where}: the optimizer files hold {got} elements of {name} (shape {tuple(shape)}); "
                "the checkpoint is inconsistent: were its files copied from different saves?"
            )
        for p in pieces[name]:
            if p.start < 0 or p.numel < 0 or p.start + p.numel > rank_sizes[p.rank]:
                raise CheckpointError(
                    f"{where}: {name} reaches past the fp32 partition of rank {p.rank} "
                    f"({p.start + p.numel} > {rank_sizes[p.rank]}); the rank file is truncated or from another save"
                )
