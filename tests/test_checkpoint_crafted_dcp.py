"""Crafted DCP folders and universal-checkpoint step files are refused in one line that names what is wrong, and
Ctrl-C inside DCP's reader stays an interrupt (not a report of a damaged file)."""

from __future__ import annotations

import pickle
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.api import CheckpointException, _wrap_exception
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

from checkpoint_helpers import DCP, UNIVERSAL
from checkpoints.dcp_metadata import read_metadata
from checkpoints.dcp_source import DcpSource
from checkpoints.source import CheckpointError
from helpers import read_command, refused

MODEL_OPTIM = next(p for p in DCP if p.name == "model_optim")


def crafted_copy(tmp_path: Path, change) -> Path:
    """A copy of the model_optim fixture whose `.metadata` entry for lin1.bias (13 elements, chunks 0..6 and
    7..12) went through `change` (the metadata read by our own checked reader, written back with pickle)."""
    folder = tmp_path / "ck"
    shutil.copytree(MODEL_OPTIM, folder)
    md = read_metadata(folder)
    change(md.state_dict_metadata["model.lin1.bias"])
    (folder / ".metadata").write_bytes(pickle.dumps(md))
    return folder


def _chunk(offset: int, size: int) -> ChunkStorageMetadata:
    return ChunkStorageMetadata(torch.Size([offset]), torch.Size([size]))


CRAFTS = {
    "a chunk dropped": (lambda e: setattr(e, "chunks", e.chunks[:1]), "hold 7 of its 13 elements, leaving a gap"),
    "no chunks": (lambda e: setattr(e, "chunks", []), "hold 0 of its 13 elements, leaving a gap"),
    "a larger size declared": (lambda e: setattr(e, "size", torch.Size([26])),
                               "hold 13 of its 26 elements, leaving a gap"),
    "overlapping chunks": (lambda e: setattr(e, "chunks", [_chunk(0, 7), _chunk(6, 7)]), "overlap"),
    "a chunk past the end": (lambda e: setattr(e, "chunks", [_chunk(0, 7), _chunk(7, 7)]), "reach past its size"),
}


@pytest.mark.parametrize("craft", CRAFTS, ids=list(CRAFTS))
@pytest.mark.parametrize("command", ["convert", "inspect"])
def test_chunks_that_do_not_tile_a_tensor_are_refused_naming_it(tmp_path, craft, command):
    change, problem = CRAFTS[craft]
    folder = crafted_copy(tmp_path, change)
    line = refused(tmp_path, *read_command(command, folder, tmp_path / "out"))
    assert f"the chunks of tensor 'model.lin1.bias' {problem}" in line and "copy the folder again" in line, line
    assert not (tmp_path / "out").exists()  # no file of uninitialised memory


def painted_once(size: tuple[int, ...], boxes) -> bool:
    """The reference: paint every chunk onto a tensor of counts; a tiling leaves every element painted once."""
    counts = torch.zeros(size, dtype=torch.int64)
    for offsets, sizes in boxes:
        if any(o + n > d for o, n, d in zip(offsets, sizes, size)):
            return False
        counts[tuple(slice(o, o + n) for o, n in zip(offsets, sizes))] += 1
    return bool((counts == 1).all())


def _draw(gen: torch.Generator, low: int, high: int) -> int:
    return int(torch.randint(low, high, (1,), generator=gen))


def damage(boxes: list, victim: int, axis: int, how: int) -> None:
    """Change chunk `victim` of a tiling in place: 0 leaves it, 1 drops it, 2 doubles it, 3 moves it and 4 grows
    it by one along `axis`, 5 puts the next chunk in its place."""
    if how == 1:
        boxes.pop(victim)
    elif how == 2:
        boxes.append(boxes[victim])
    elif how in (3, 4):
        offsets, sizes = map(list, boxes[victim])
        (offsets if how == 3 else sizes)[axis] += 1
        boxes[victim] = (tuple(offsets), tuple(sizes))
    elif how == 5:  # the counts still add up only if the two are the same size
        boxes[victim] = boxes[(victim + 1) % len(boxes)]


def test_the_tiling_check_agrees_with_painting_the_chunks(tmp_path):
    from checkpoints.dcp_metadata import _tiling_problem

    gen = torch.Generator().manual_seed(0)
    cases = [((), [((), ())]), ((), [((), ()), ((), ())]), ((), []), ((0, 3), [((0, 0), (0, 3))]),
             ((4,), [((4,), (0,)), ((0,), (4,))]), ((4, 6), [((0, 0), (4, 3)), ((0, 3), (4, 3))])]
    for _ in range(400):  # random grids of chunks, then one dropped, duplicated, moved or grown
        size = tuple(_draw(gen, 1, 7) for _ in range(_draw(gen, 1, 4)))
        boxes = [((), ())]
        for d in size:
            edges = sorted({0, d, _draw(gen, 0, d + 1), _draw(gen, 0, d + 1)})
            boxes = [((*o, a), (*n, b - a)) for o, n in boxes for a, b in zip(edges, edges[1:])]
        victim, axis, how = _draw(gen, 0, len(boxes)), _draw(gen, 0, len(size)), _draw(gen, 0, 5)
        damage(boxes, victim, axis, how)
        cases.append((size, boxes))
    verdicts = [(_tiling_problem(size, boxes) is None, painted_once(size, boxes)) for size, boxes in cases]
    assert [c for c, (ours, reference) in zip(cases, verdicts) if ours != reference] == []
    assert sum(ours for ours, _ in verdicts) > 50 and sum(not ours for ours, _ in verdicts) > 50  # both kinds tried
    # what dcp.save writes for 0-d and empty tensors passes too
    state = {"w": torch.randn(3, 4), "scale": torch.tensor(2.5), "none": torch.empty(0, 4)}
    save_dcp(tmp_path / "ck", {"model": state})
    src = DcpSource(tmp_path / "ck")
    assert all(torch.equal(src.load(name), t) for name, t in state.items())


def save_dcp(folder: Path, state: dict) -> None:
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no process group": one process saves everything
        dcp.save(state, checkpoint_id=str(folder))


def optimizer_save(folder: Path, step: torch.Tensor) -> None:
    state = {"step": step, "exp_avg": torch.zeros(3, 4), "exp_avg_sq": torch.zeros(3, 4)}
    save_dcp(folder, {"model": {"w": torch.randn(3, 4)}, "optim": {"state": {"w": state}}})


def test_a_dcp_step_must_be_a_whole_count(tmp_path):
    optimizer_save(tmp_path / "good", torch.tensor(7.0))
    src = DcpSource(tmp_path / "good")
    assert (src.saved_step(), src.summary().step) == (7, 7)
    for name, value in {"nan": float("nan"), "inf": float("inf"), "negative": -1.0, "fractional": 2.5}.items():
        optimizer_save(tmp_path / name, torch.tensor(value))
        line = refused(tmp_path, "inspect", tmp_path / name)
        assert "(optim.state.w.step) holds" in line and "not one finite whole number >= 0" in line, line
        with pytest.raises(CheckpointError, match=r"optim\.state\.w\.step\) holds .* as its step"):
            DcpSource(tmp_path / name).saved_step()  # as a resume reads it


@pytest.mark.parametrize("step", [torch.tensor([1.0, 2.0]), torch.tensor(float("nan")), torch.tensor(-3)],
                         ids=["two elements", "nan", "negative"])
def test_a_universal_step_file_that_is_not_a_whole_count_is_refused(tmp_path, step):
    folder = tmp_path / "univ"
    shutil.copytree(UNIVERSAL[0], folder)
    tag = next(folder.glob("global_step*_universal"))
    for states in tag.glob("*model_states.pt"):  # without them the step comes from zero/<name>/step.pt
        states.unlink()
    for path in tag.glob("zero/*/step.pt"):
        torch.save(step, path)
    line = refused(tmp_path, "inspect", tag)
    assert "step.pt holds" in line and "as its step, not one finite whole number >= 0" in line, line


def _stop_reading(src: DcpSource, exc: BaseException) -> None:
    def read_data(*args, **kwargs):
        raise exc

    src._reader.read_data = read_data


def test_ctrl_c_inside_dcps_reader_is_a_keyboard_interrupt():
    """DCP wraps whatever its reader raises in a CheckpointException (a BaseException): a KeyboardInterrupt in
    there is the user's Ctrl-C and must reach the caller's interrupt handling, not read as a damaged file."""
    src = DcpSource(MODEL_OPTIM)
    _stop_reading(src, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        src.load("lin1.bias")
    _stop_reading(src, OSError(5, "Input/output error"))  # a read failure still is one line naming the tensor
    with pytest.raises(CheckpointError, match=r"cannot read model\.lin1\.bias: .*Input/output error"):
        src.load("lin1.bias")


def test_a_keyboard_interrupt_nested_in_checkpoint_exceptions_propagates(monkeypatch):
    import torch.distributed.checkpoint as dcp

    inner = CheckpointException("read", {0: _wrap_exception(KeyboardInterrupt())})

    def load(*args, **kwargs):
        raise CheckpointException("load", {0: _wrap_exception(ValueError("rank 0")), 1: _wrap_exception(inner)})

    monkeypatch.setattr(dcp, "load", load)
    with pytest.raises(KeyboardInterrupt):
        DcpSource(MODEL_OPTIM).load("lin1.bias")



def test_two_entries_for_one_parameter_name_are_refused_not_merged(tmp_path):
    """`emb.weight` beside a compiled model's `_orig_mod.emb.weight`: both name one parameter, so neither can be
    picked silently."""
    import torch.distributed.checkpoint as dcp

    state = {"model": {"emb.weight": torch.zeros(2, 3), "_orig_mod.emb.weight": torch.ones(2, 3)}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
    with pytest.raises(CheckpointError) as e:
        DcpSource(tmp_path / "dcp").params()
    assert "'model.emb.weight' and 'model._orig_mod.emb.weight' are both the parameter 'emb.weight'" in str(e.value)
