"""Save debris and commit edges: odd pids in leftover names, stray `latest` temp files, a failed move of
`latest` after the tag's rename, pruning beside an unreadable `latest`, and client_state refused up front."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import zero_core
from checkpoints import zbench_format as fmt
from checkpoints.source import CheckpointError
from ckpt_workers import _train, config
from dist_harness import run_ranks
from parity_workers import make_model

DEAD = 4194000  # below Linux's pid ceiling; no test machine runs that many processes


def _engine():
    engine = zero_core.initialize(make_model(), config(2, 1))
    _train(engine, 0, 1, range(1))
    return engine


def _tag(root: Path, tag: str, payload: str) -> Path:
    folder = root / tag
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"step": 1, "payload": payload}))
    return folder


def test_huge_or_zero_pid_in_a_leftover_name_is_not_alive_and_not_deleted(tmp_path):
    assert fmt._pid_alive(10**30) is False and fmt._pid_alive(0) is False
    huge = tmp_path / ".x.partial-99999999999999999999999-ab"
    huge.mkdir()
    assert fmt.leftovers(tmp_path) == [huge]
    engine = _engine()
    engine.save_checkpoint(tmp_path)  # no OverflowError
    assert huge.is_dir()
    assert fmt.resolve(tmp_path).name == "global_step1"


def test_latest_temp_files_of_dead_saves_are_reported_not_removed(tmp_path, capsys):
    dead = tmp_path / f".latest.tmp-{DEAD}-ab12"
    live = tmp_path / f".latest.tmp-{os.getpid()}-cd34"
    dead.write_text("x\n")
    live.write_text("y\n")
    (tmp_path / f".x.tmp-{DEAD}-ab").write_text("a tag's name, not latest's: not ours\n")
    assert fmt.leftovers(tmp_path) == [dead]
    _engine().save_checkpoint(tmp_path)
    assert dead.name in capsys.readouterr().out
    assert dead.is_file() and live.is_file()


def test_a_failed_move_of_latest_puts_the_replaced_tag_back(tmp_path, monkeypatch):
    _tag(tmp_path, "t1", "old")
    (tmp_path / "latest").write_text("t1\n")
    staged = _tag(tmp_path, ".t1.partial-1-ab", "new")

    def no_inode(root, tag):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fmt, "_write_latest", no_inode)
    with pytest.raises(OSError):
        fmt.commit(tmp_path, "t1", staged)
    assert json.loads((tmp_path / "t1" / "manifest.json").read_text())["payload"] == "old"
    assert json.loads((staged / "manifest.json").read_text())["payload"] == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".t1.partial-1-ab", "latest", "t1"]


def test_a_failed_write_of_latest_leaves_no_temp_file(tmp_path, monkeypatch):
    real_replace = os.replace

    def failing(src, dst):
        if str(src).startswith(str(tmp_path / ".latest.tmp-")):
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(fmt.os, "replace", failing)
    with pytest.raises(OSError):
        fmt._write_latest(tmp_path, "t1")
    assert list(tmp_path.iterdir()) == []


def test_prune_beside_an_unreadable_latest_is_a_note(tmp_path):
    _tag(tmp_path, "a", "1")
    _tag(tmp_path, "b", "2")
    os.symlink("b", tmp_path / "latest")
    saved = [(t, fmt.folder_identity(tmp_path / t)) for t in ("a", "b")]
    notes = fmt.prune(tmp_path, 1, saved)
    assert len(notes) == 1 and "not pruned" in notes[0]
    assert (tmp_path / "a").is_dir() and (tmp_path / "b").is_dir()


def test_client_state_not_a_dict_or_too_deep_is_refused_before_anything_is_written(tmp_path):
    engine = _engine()
    deep: dict = {}
    node = deep
    for _ in range(5000):
        node["x"] = {}
        node = node["x"]
    for bad, words in (([1, 2], "must be a dict"), (deep, "nested more than")):
        with pytest.raises(CheckpointError, match=words) as e:
            engine.save_checkpoint(tmp_path / "ck", client_state=bad)
        assert "\n" not in str(e.value)
    assert not (tmp_path / "ck").exists()


def _two_rank_saves(rank: int, world: int, root: str) -> dict:
    engine = zero_core.initialize(make_model(), {**config(2, world), "zero_core": {"comm_timeout_s": 20}})
    _train(engine, rank, world, range(1))
    out: dict = {}
    try:
        engine.save_checkpoint(root, client_state=[1])  # type: ignore[arg-type]
    except CheckpointError as e:
        out["list"] = str(e)
    engine.save_checkpoint(root, keep_last=1, save_latest=False)
    if rank == 0:
        Path(root, "latest").write_text("runs/best\n")
    import torch.distributed as dist

    dist.barrier()
    _train(engine, rank, world, range(1, 2))
    engine.save_checkpoint(root, keep_last=1, save_latest=False)  # committed: pruning's trouble is a note
    _train(engine, rank, world, range(2, 3))
    out["names"] = sorted(os.listdir(root))
    return out


def test_two_ranks_agree_when_pruning_meets_an_odd_latest(tmp_path):
    root = tmp_path / "ck"
    got = run_ranks(_two_rank_saves, 2, str(root))
    assert "must be a dict" in got["list"]
    assert got["names"] == ["global_step1", "global_step2", "latest"]
    assert (root / "latest").read_text() == "runs/best\n"
