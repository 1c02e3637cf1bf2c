"""Ctrl-C or an exception in the middle of `save_checkpoint` (one rank): the staging folder the save made is removed
on the way out, the exception goes on, and the previous checkpoint and `latest` are as they were; a folder the save
did not make (the copy a re-save replaced) is never removed. An async save's background thread is not cut short by
a Ctrl-C during `wait_for_checkpoint()`: a later wait reports it only once it has finished."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest
from ckpt_workers import _train, config
from helpers import snapshot
from parity_workers import make_model

from checkpoints import zbench_format as fmt
from checkpoints.save_names import LATEST

POLLS = 1500  # 30 s at most for a thread to see the main thread waiting: a bound on a hung test, not a timing


@pytest.fixture
def run(tmp_path):
    """An engine one step past its saved checkpoint (global_step1), and the checkpoint folder."""
    import zero_core

    engine = zero_core.initialize(make_model(), config(2, 1))
    _train(engine, 0, 1, range(1))
    engine.save_checkpoint(tmp_path / "ckpt")
    _train(engine, 0, 1, range(1, 2))
    yield engine, tmp_path / "ckpt"
    engine.close()


def _resaves_fine(engine, root) -> None:
    engine.save_checkpoint(root)
    assert sorted(os.listdir(root)) == ["global_step1", "global_step2", LATEST]
    assert fmt.read_latest(root) == "global_step2"


def test_ctrl_c_while_the_files_are_written_removes_the_staging_folder(run, monkeypatch):
    from zero_core import checkpointing

    engine, root = run
    before, real = snapshot(root), checkpointing._write_file

    def interrupted(content, path):
        real(content, path)  # the file is on disk when the key is pressed
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpointing, "_write_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        engine.save_checkpoint(root)
    assert snapshot(root) == before  # no .partial folder; the previous checkpoint and `latest` untouched
    monkeypatch.undo()
    _resaves_fine(engine, root)


def test_a_real_sigint_mid_save_does_the_same(run, monkeypatch):
    from zero_core import checkpointing

    engine, root = run
    before, real = snapshot(root), checkpointing._write_file

    def sigint(content, path):
        _ctrl_c()  # Python raises it in the main thread, wherever the save has got to
        return real(content, path)

    monkeypatch.setattr(checkpointing, "_write_file", sigint)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            engine.save_checkpoint(root)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert snapshot(root) == before


@pytest.mark.parametrize("async_save", [False, True])
def test_an_exception_while_the_manifest_is_made_removes_it(run, async_save):
    engine, root = run
    before = snapshot(root)
    engine.optimizer.param_groups[0]["lr"] = float("nan")  # a loop's bad write, found when the save records the lrs
    with pytest.raises(ValueError, match="lr"):
        engine.save_checkpoint(root, async_save=async_save)
    assert snapshot(root) == before
    engine.optimizer.param_groups[0]["lr"] = 1e-4
    _resaves_fine(engine, root)


def test_ctrl_c_while_an_async_save_copies_the_state_removes_it(run, monkeypatch):
    from zero_core import checkpointing

    engine, root = run
    before = snapshot(root)

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpointing, "contents", interrupted)
    with pytest.raises(KeyboardInterrupt):
        engine.save_checkpoint(root, async_save=True)
    assert snapshot(root) == before


def test_the_copy_a_resave_replaced_is_not_removed_as_the_saves_own(run, monkeypatch):
    """Ctrl-C after the new copy of a tag took the old one's place (the staging folder's name now holds the old
    copy): that folder is no longer the one the save made, so nothing of the old copy is deleted."""
    from checkpoints import dir_exchange

    engine, root = run
    engine.save_checkpoint(root, tag="best")
    old = {name: digest for name, digest in snapshot(root / "best").items()}
    _train(engine, 0, 1, range(2, 3))

    def exchanged_then_interrupted(*args):
        raise KeyboardInterrupt

    probe = root / ".probe"
    (probe / "a").mkdir(parents=True)
    (probe / "b").mkdir()
    if not dir_exchange.exchange(probe / "a", probe / "b"):
        pytest.skip("this filesystem cannot exchange two folders: the replaced copy is moved aside instead")
    for d in (probe / "a", probe / "b", probe):
        d.rmdir()
    monkeypatch.setattr(fmt, "_write_latest", exchanged_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        engine.save_checkpoint(root, tag="best")
    kept = [d for d in root.iterdir() if d.name.startswith(".best.partial-")]
    assert len(kept) == 1 and snapshot(kept[0]) == old  # the replaced copy, whole
    assert fmt.read_latest(root) == "best"


def _ctrl_c() -> None:
    """SIGINT to the main thread, as the terminal's Ctrl-C reaches it (sent to the process, another thread may take
    it, and the main thread learns of it only once it wakes)."""
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


def _main_thread_waits() -> bool:
    """Whether the main thread is inside AsyncSaver.wait (whatever it waits on there)."""
    from zero_core.checkpoint_async import AsyncSaver

    frame = sys._current_frames().get(threading.main_thread().ident)
    while frame is not None and frame.f_code is not AsyncSaver.wait.__code__:
        frame = frame.f_back
    return frame is not None


def _until_main_waits() -> None:
    for _ in range(POLLS):
        if _main_thread_waits():
            return
        time.sleep(0.02)


def test_ctrl_c_in_wait_for_checkpoint_does_not_cut_the_async_save_short(run, monkeypatch):
    from zero_core import checkpointing

    engine, root = run
    go, interrupted, real = threading.Event(), threading.Event(), checkpointing.write_files

    def held(*args):
        go.wait()  # the background save writes only once the main thread waits for it a second time
        return real(*args)

    def press_ctrl_c_then_let_it_write() -> None:
        _until_main_waits()
        _ctrl_c()
        interrupted.wait()
        _until_main_waits()  # the second wait
        go.set()

    monkeypatch.setattr(checkpointing, "write_files", held)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    helper = threading.Thread(target=press_ctrl_c_then_let_it_write)
    try:
        engine.save_checkpoint(root, async_save=True)
        helper.start()
        with pytest.raises(KeyboardInterrupt):
            engine.wait_for_checkpoint()
    finally:
        signal.signal(signal.SIGINT, previous)
        interrupted.set()
    assert engine.wait_for_checkpoint() == root / "global_step2"  # returns once the save has finished
    assert fmt.read_latest(root) == "global_step2"
    assert sorted(os.listdir(root)) == ["global_step1", "global_step2", LATEST]
    helper.join()


EXIT_SCRIPT = """
import sys, time
from ckpt_workers import _train, config
from parity_workers import make_model
import zero_core
from zero_core import checkpointing

engine = zero_core.initialize(make_model(), config(2, 1))
_train(engine, 0, 1, range(1))
engine.save_checkpoint(sys.argv[1])
_train(engine, 0, 1, range(1, 2))
real = checkpointing.write_files


def late(*args):
    time.sleep(0.5)  # the script has ended by now: its exit must wait for this save
    return real(*args)


checkpointing.write_files = late
engine.save_checkpoint(sys.argv[1], async_save=True)
"""


@pytest.mark.slow  # a fresh interpreter: its exit is what is under test
def test_a_script_that_ends_with_an_async_save_in_flight_commits_it(tmp_path):
    import subprocess

    from helpers import REPO

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), str(REPO)])}
    done = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, str(tmp_path / "ckpt")], capture_output=True,
                          text=True, cwd=REPO, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert fmt.read_latest(tmp_path / "ckpt") == "global_step2", done.stdout[-2000:]
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["global_step1", "global_step2", LATEST]
