"""The flat layout covers every parameter element exactly once across ranks, with aligned shards."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from checkpoints.layout import build_layout

shapes = st.lists(st.lists(st.integers(1, 9), min_size=1, max_size=3).map(tuple), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(shapes=shapes, world=st.integers(1, 5), bucket=st.integers(1, 300), align=st.sampled_from([1, 4, 64]))
def test_fragments_cover_each_element_once(shapes, world, bucket, align):
    layout = build_layout([(f"p{i}", s) for i, s in enumerate(shapes)], world, bucket_numel=bucket, align=align)
    seen: dict[int, list[int]] = {i: [0] * layout.slots[i].numel for i in range(len(shapes))}
    for r in range(world):
        frags = layout.fragments(r)
        offsets = [f.partition_offset for f in frags]
        assert offsets == sorted(offsets)
        for f in frags:
            assert 0 <= f.partition_offset and f.partition_offset + f.numel <= layout.partition_numel
            for k in range(f.param_start, f.param_start + f.numel):
                seen[f.param_index][k] += 1
    assert all(c == 1 for counts in seen.values() for c in counts)
    for g in layout.groups:
        assert g.padded_numel == g.shard_numel * world
        assert g.shard_numel % align == 0
        assert g.numel <= g.padded_numel
    assert all(s.offset % align == 0 for s in layout.slots)


def test_group_bounds_make_one_group_per_unit():
    layout = build_layout([("a", (3,)), ("b", (5, 2)), ("c", (7,))], 3, group_bounds=[0, 2], align=4)
    assert [tuple(s.name for s in g.slots) for g in layout.groups] == [("a", "b"), ("c",)]
    # a: [0,3) -> 4, b: [4,14) -> 16, padded to a multiple of 3*4
    assert layout.groups[0].padded_numel == 24 and layout.groups[0].shard_numel == 8
    assert layout.groups[1].partition_offset == 8
    assert layout.shard_range(0, 2) == (16, 24)


def test_bucket_closes_at_size():
    layout = build_layout([(str(i), (10,)) for i in range(5)], 2, bucket_numel=20, align=1)
    assert [len(g.slots) for g in layout.groups] == [2, 2, 1]


def test_bad_world_size():
    with pytest.raises(ValueError, match="world_size"):
        build_layout([("a", (1,))], 0)
