"""Async checkpoint saves: the same bytes as a synchronous save, the state of the moment it was called, and a
previous checkpoint that stays loadable when the process is killed at any phase of the background write."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

import zero_core
from async_ckpt_workers import PHASES, async_then_train, killed_during_async_save
from checkpoints import manifest as mf
from checkpoints import zbench_format as fmt
from ckpt_workers import _train, config
from dist_harness import run_ranks
from parity_workers import make_model

pytestmark = pytest.mark.slow  # spawned ranks or whole runs: outside the fast tier (-m 'not slow')


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


@pytest.mark.slow  # 2 spawned ranks
def test_async_and_sync_checkpoints_are_bitwise_equal_and_hold_the_saved_moment(tmp_path):
    got = run_ranks(async_then_train, 2, str(tmp_path))
    sync, async_ = tmp_path / "sync", tmp_path / "async"
    for name in mf.read(sync)["files"]:
        assert (sync / name).read_bytes() == (async_ / name).read_bytes(), name
    assert mf.read(sync)["files"] == mf.read(async_)["files"]
    assert got["buffer_bytes"] > 0 and got["reused"]
    assert fmt.read_latest(tmp_path) == "again" and not list(tmp_path.glob(".*partial*"))
    engine = zero_core.initialize(make_model(), config(1, 1))
    engine.load_checkpoint(tmp_path, tag="async")
    assert _max_diff(engine.full_state_dict(), got["expected"]) == 0.0


def test_config_key_makes_saves_async_and_wait_commits(tmp_path):
    engine = zero_core.initialize(make_model(), {**config(2, 1), "zero_core": {"async_checkpoint": True}})
    _train(engine, 0, 1, range(1))
    engine.save_checkpoint(tmp_path)
    assert engine._async_saver._pending is not None  # in flight (or done) until waited for
    assert engine.wait_for_checkpoint() == tmp_path / "global_step1"
    assert engine.wait_for_checkpoint() is None
    assert fmt.read_latest(tmp_path) == "global_step1" and mf.read(tmp_path / "global_step1")["step"] == 1


@pytest.mark.parametrize("stage, offload", [(1, False), (2, True), (3, False), (3, "nvme")])
def test_the_config_key_reserves_the_buffers_the_first_async_save_uses(tmp_path, stage, offload):
    """With async_checkpoint set, initialize starts making the host buffers (pinning them takes seconds on a GPU
    host); the first async save copies into those very tensors instead of making its own."""
    engine = zero_core.initialize(make_model(), {**config(stage, 1, offload), "zero_core": {"async_checkpoint": True}})
    buffers = engine._async_saver.buffers
    reserved = dict(buffers._bufs) if buffers.nbytes else {}  # nbytes waits for the reserving thread
    assert reserved and all(t.numel() for t in reserved.values())
    _train(engine, 0, 1, range(1))
    engine.save_checkpoint(tmp_path)
    engine.wait_for_checkpoint()
    assert buffers._bufs.keys() == reserved.keys()
    assert all(buffers._bufs[k] is t for k, t in reserved.items())
    plain = zero_core.initialize(make_model(), config(stage, 1, offload))
    assert getattr(plain, "_async_saver", None) is None  # nothing reserved without the key


def test_a_failed_async_save_is_reported_by_wait(tmp_path, monkeypatch):
    from zero_core import checkpointing

    engine = zero_core.initialize(make_model(), config(2, 1))
    _train(engine, 0, 1, range(1))
    engine.save_checkpoint(tmp_path)

    def full(tensors, path):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(checkpointing, "_write_synced", full)
    engine.save_checkpoint(tmp_path, tag="later", async_save=True)
    with pytest.raises(ValueError, match="checkpoint later was not saved.*previous checkpoint \\(global_step1\\)"):
        engine.wait_for_checkpoint()
    assert fmt.read_latest(tmp_path) == "global_step1" and not list(tmp_path.glob(".later*"))


@pytest.mark.slow  # 2 spawned ranks per phase
@pytest.mark.parametrize("phase", PHASES)
def test_killed_at_any_phase_of_an_async_save_keeps_the_previous_checkpoint(tmp_path, phase):
    with pytest.raises(mp.ProcessExitedException):
        run_ranks(killed_during_async_save, 2, str(tmp_path), phase)
    assert fmt.read_latest(tmp_path) == "global_step2"
    expected = torch.load(tmp_path / "expected_rank0.pt")
    engine = zero_core.initialize(make_model(), config(1, 1))
    assert engine.load_checkpoint(tmp_path)[1] == {"next_batch": 2}
    assert _max_diff(engine.full_state_dict(), expected) == 0.0
    if phase == "latest":  # renamed in, `latest` not moved: the new one is complete and loads too
        assert engine.load_checkpoint(tmp_path, tag="global_step3")[1] == {"next_batch": 3}


def test_an_unexpected_error_in_the_background_is_reported_not_lost(tmp_path, monkeypatch):
    from zero_core import checkpointing

    engine = zero_core.initialize(make_model(), config(2, 1))
    _train(engine, 0, 1, range(1))

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")
    monkeypatch.setattr(checkpointing, "publish", broken)
    engine.save_checkpoint(tmp_path, async_save=True)
    with pytest.raises(ValueError, match="background save failed \\(RuntimeError: a bug\\)"):
        engine.wait_for_checkpoint()
    assert fmt.read_latest(tmp_path) is None and not list(tmp_path.iterdir())
