"""The check that a DCP tensor's chunks cover it exactly once (checkpoints/dcp_tiling.py): exact on overlaps and
gaps, by corner parity and counting for everyday layouts and by the sweep past the corner budget, and linear in
the chunks for hundreds of thousands of one-element chunks (counted in corners, not timed)."""

from __future__ import annotations

import dataclasses

import pickle
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex

from checkpoints import dcp_tiling
from checkpoints.dcp_metadata import read_metadata
from checkpoints.dcp_tiling import odd_corners, tiling_problem
from checkpoints.source import CheckpointError
from test_checkpoint_crafted_dcp import _draw, damage, painted_once


def _grid(size: tuple[int, ...], cuts: list[list[int]]) -> list:
    """The chunks of a grid cut at `cuts[d]` along each dimension d."""
    boxes = [((), ())]
    for d, inner in zip(size, cuts):
        edges = sorted({0, d, *inner})
        boxes = [((*o, a), (*n, b - a)) for o, n in boxes for a, b in zip(edges, edges[1:])]
    return boxes


def _cases() -> list:
    gen = torch.Generator().manual_seed(1)
    cases = [((), [((), ())]), ((), [((), ()), ((), ())]), ((), []), ((0, 3), []), ((0, 3), [((0, 0), (0, 3))]),
             ((2, 2), [((0, 0), (1, 2)), ((0, 0), (1, 2))]),  # counts add up, one row twice, the other never
             ((4,), [((0,), (2,)), ((1,), (2,))]), ((3, 3), [((0, 0), (2, 2)), ((1, 1), (2, 2))]),
             ((2, 3), [((0, 0), (2, 3))] * 3)]  # covered three times: odd everywhere, yet no tiling
    for _ in range(600):  # random grids, up to 4 dimensions, then one chunk dropped, doubled, moved, grown or swapped
        size = tuple(_draw(gen, 1, 6) for _ in range(_draw(gen, 1, 5)))
        boxes = _grid(size, [[_draw(gen, 0, d + 1) for _ in range(3)] for d in size])
        damage(boxes, _draw(gen, 0, len(boxes)), _draw(gen, 0, len(size)), _draw(gen, 0, 6))
        cases.append((size, boxes))
    return cases


@pytest.mark.parametrize("budget", [None, 0], ids=["corner parity", "sweep"])
def test_the_verdict_agrees_with_painting_the_chunks(budget):
    cases = _cases()
    verdicts = [(tiling_problem(size, boxes, budget) is None, painted_once(size, boxes)) for size, boxes in cases]
    assert [c for c, (ours, reference) in zip(cases, verdicts) if ours != reference] == []
    assert sum(ours for ours, _ in verdicts) > 100 and sum(not ours for ours, _ in verdicts) > 100


def test_each_problem_is_named():
    assert tiling_problem((13,), [((0,), (7,)), ((6,), (7,))]) == "overlap"  # more elements than the tensor
    assert tiling_problem((13,), [((0,), (7,))]) == "hold 7 of its 13 elements, leaving a gap"
    assert tiling_problem((13,), [((0,), (7,)), ((7,), (7,))]) == "reach past its size"
    # the counts add up, yet one element is covered twice and another never: an overlap, found by parity
    assert tiling_problem((4,), [((0,), (2,)), ((1,), (2,))]) == "overlap"
    assert tiling_problem((2, 2), [((0, 0), (1, 2)), ((0, 0), (1, 2))]) == "overlap"


def _no_sweep(monkeypatch):
    def sweep(*args):
        raise AssertionError("the sweep ran: the corners went over the budget")

    monkeypatch.setattr(dcp_tiling, "sweep_overlaps", sweep)


@pytest.mark.parametrize("size", [(200_000,), (100, 200), (20, 25, 40)], ids=["1-D 200k", "2-D 20k", "3-D 20k"])
def test_one_element_chunks_are_checked_in_corners_linear_in_them(monkeypatch, size):
    """Each one-element chunk of a d-dimensional tensor has at most 2**d inside corners, so the parity check
    stays within its budget and never falls back to the sweep, which compares each chunk with every chunk
    still open beside it (minutes for a 2-D grid of 200k)."""
    boxes = _grid(size, [range(d) for d in size])
    assert odd_corners(size, boxes, budget=2 ** len(size) * len(boxes)) == {(0,) * len(size)}
    _no_sweep(monkeypatch)
    assert tiling_problem(size, boxes) is None
    last = boxes[-1]
    assert tiling_problem(size, boxes[:-1] + [boxes[0]]) == "overlap"  # the last element's chunk is the first's
    assert tiling_problem(size, boxes[:-1]).endswith("leaving a gap")
    assert tiling_problem(size, boxes[:-1] + [(last[0], tuple(n + 1 for n in last[1]))]) == "reach past its size"


def test_a_layout_past_the_corner_budget_is_still_decided_exactly(monkeypatch):
    """Chunks split along all 11 dimensions have up to 2,048 inside corners each: past the budget, the sweep
    decides."""
    size = (2,) * 11
    boxes = _grid(size, [[1]] * 11)
    calls = []
    sweep = dcp_tiling.sweep_overlaps
    monkeypatch.setattr(dcp_tiling, "sweep_overlaps", lambda *a: calls.append(1) or sweep(*a))
    assert tiling_problem(size, boxes) is None and calls
    assert tiling_problem(size, boxes[:-1] + [boxes[0]]) == "overlap"


def _crafted(tmp_path: Path, rows: int, cols: int, change=None) -> Path:
    """A DCP folder whose (rows, cols) tensor `w` is listed as one-element chunks, each with a storage entry of 4
    bytes of its own inside the saved chunk's (only `.metadata` is read here)."""
    import torch.distributed.checkpoint as dcp

    folder = tmp_path / "ck"
    shutil.rmtree(folder, ignore_errors=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": {"w": torch.zeros(rows, cols)}}, checkpoint_id=str(folder), no_dist=True)
    md = read_metadata(folder)
    entry = md.state_dict_metadata["model.w"]
    info = next(v for k, v in md.storage_data.items() if k.fqn == "model.w")
    entry.chunks = [ChunkStorageMetadata(torch.Size([i, j]), torch.Size([1, 1]))
                    for i in range(rows) for j in range(cols)]
    if change:
        change(entry)
    md.storage_data = {MetadataIndex("model.w", c.offsets, k): dataclasses.replace(info, offset=info.offset + 4 * k,
                                                                                    length=4)
                       for k, c in enumerate(entry.chunks)}
    (folder / ".metadata").write_bytes(pickle.dumps(md))
    return folder


def test_a_dcp_metadata_of_one_element_chunks_is_read_and_its_overlaps_refused(tmp_path, monkeypatch):
    _no_sweep(monkeypatch)
    md = read_metadata(_crafted(tmp_path, 50, 100))
    assert len(md.state_dict_metadata["model.w"].chunks) == 5_000

    def doubled(entry):  # the last element's chunk replaced by a second copy of the first's
        entry.chunks[-1] = ChunkStorageMetadata(torch.Size([0, 0]), torch.Size([1, 1]))

    with pytest.raises(CheckpointError, match=r"the chunks of tensor 'model.w' overlap"):
        read_metadata(_crafted(tmp_path, 50, 100, doubled))
