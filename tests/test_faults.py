"""Reliability battery, faults: a hung collective, NaN/inf losses under bf16 and fp16, a full disk while saving.

Each fault ends in one clear line naming what happened and the fix, and loses nothing: a skipped
step leaves every weight as it was, a failed save leaves `latest` and the previous checkpoint exactly
as they were (they load bit for bit) and no debris that blocks the next save.
"""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path

import pytest
import torch

import zero_core
from checkpoints import zbench_format as fmt
from checkpoints.source import CheckpointError
from ckpt_workers import _train, config
from dist_harness import run_ranks
from fault_workers import (
    HANG_TIMEOUT_S,
    disk_full_on_rank_1,
    file_size_limit,
    hang_in_stage3_gather,
    tiny_checkpoint,
    unwritable,
)
from helpers import cli, one_line_error, snapshot, write_scenario, zbench
from parity_workers import ds_config, make_batches, make_model

pytestmark = pytest.mark.slow  # spawned ranks or whole runs: outside the fast tier (-m 'not slow')


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


# -- a hung collective ----------------------------------------------------------------------------
def test_hung_peer_is_a_timeout_naming_the_rank_and_the_collective(tmp_path):
    got = run_ranks(hang_in_stage3_gather, 2, str(tmp_path / "verdict"))
    msg = got["message"]
    assert msg is not None and "\n" not in msg
    # the first collective of step 2: a unit's all-gather, or with every unit kept whole (gathered again at the end
    # of step 1) a gradient bucket's reduce-scatter
    collective = r"(all-gather of stage-3 unit \d+|reduce-scatter of gradient bucket \d+)"
    assert re.match(rf"rank 0: {collective} timed out after {HANG_TIMEOUT_S:.0f}\.", msg), msg
    assert "a peer rank stopped or hung" in msg and "comm_timeout_s" in msg


def test_zbench_run_reports_a_hung_rank_as_one_error(tmp_path):
    micro = tmp_path / "micro.json"
    micro.write_text(
        json.dumps(
            {"family": "gpt", "config": {"vocab_size": 64, "block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 16}}
        )
    )
    scenario = {
        "name": "hang",
        "model": {"arch": str(micro)},
        "data": {"synthetic": {"train_samples": 32, "eval_samples": 8}},
        "seq_len": 8,
        "steps": 4,
        "batch_size": 2,
        "gpus": 2,
        "comm_timeout_s": 2,
        "variants": [{"name": "zero2", "engine": "zero", "stage": 2}],
    }
    path = write_scenario(tmp_path, scenario, "hang")
    proc = zbench(
        "run",
        path,
        "--out",
        str(tmp_path / "runs"),
        "--wandb",
        "off",
        "--no-progress",
        faults="hang-at-step-3",
        timeout=120,
    )
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, proc.stderr
    assert errors[0].startswith(
        "Error: variant 'zero2' (train, batch 2) failed on rank 0 (exit code 1): CollectiveTimeout: "
        "rank 0: all-reduce of the gradient norm and overflow flag timed out after 2."
    ), errors[0]
    assert "Traceback" not in errors[0]


# -- NaN / inf losses -----------------------------------------------------------------------------
def _snapshot_state(engine) -> list[torch.Tensor]:
    opt = engine.optimizer
    return [t.clone() for t in (opt.master, opt.states.exp_avg, opt.states.exp_avg_sq)] + [
        p.detach().clone() for p in engine.module.parameters()
    ]


def _unchanged(before: list[torch.Tensor], after: list[torch.Tensor]) -> bool:
    return all(torch.equal(a, b) for a, b in zip(before, after))


def _train_poisoned(engine, steps: int, poison: dict[int, float]) -> list[bool]:
    """Train `steps` steps, multiplying the loss of step i by poison[i]; whether each step left the state as it was."""
    unchanged = []
    for i, (x, y) in enumerate(make_batches(steps, 4)):
        before = _snapshot_state(engine)
        loss = engine(x, y).loss
        engine.backward(loss * poison[i] if i in poison else loss)
        engine.step()
        unchanged.append(_unchanged(before, _snapshot_state(engine)))
    return unchanged


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_nonfinite_losses_are_skipped_and_counted(dtype):
    engine = zero_core.initialize(make_model(), ds_config(2, dtype, 4))
    unchanged = _train_poisoned(engine, 6, {1: float("nan"), 4: float("inf")})
    assert unchanged == [False, True, False, False, True, False]  # skipped steps change no weight, no moment
    assert engine.skipped_steps == 2 and engine.global_step == 6
    assert engine.loss_scale == (2.0**6 if dtype == "fp16" else 1.0)  # fp16: 2**8 halved once per overflow


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_consecutive_nonfinite_steps_stop_with_one_line(dtype):
    cfg = {**ds_config(2, dtype, 4), "zero_core": {"max_consecutive_nonfinite": 2}}
    engine = zero_core.initialize(make_model(), cfg)
    nan = float("nan")
    assert _train_poisoned(engine, 3, {1: nan}) == [False, True, False]  # one bad step alone: skipped, run goes on
    before = _snapshot_state(engine)
    with pytest.raises(zero_core.NonFiniteError) as e:
        _train_poisoned(engine, 2, {0: nan, 1: nan})
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("step 5: gradients were NaN/inf for 2 consecutive steps")
    assert "max_consecutive_nonfinite = 2" in msg and "3 of 5 steps skipped" in msg
    assert engine.skipped_steps == 3 and _unchanged(before, _snapshot_state(engine))


# -- a full disk while saving ---------------------------------------------------------------------
def test_disk_full_on_one_rank_keeps_the_previous_checkpoint(tmp_path):
    got = run_ranks(disk_full_on_rank_1, 2, str(tmp_path))
    msg = got["message"]
    assert msg is not None and "\n" not in msg
    assert re.match(
        f"checkpoint global_step3 was not saved in {re.escape(str(tmp_path))}: rank 1 could not write "
        f"{re.escape(str(tmp_path))}/\\.global_step3\\.partial-\\d+-[0-9a-f]+/rank_00001\\.safetensors "
        "\\(no space left on the device\\)",
        msg,
    ), msg
    assert msg.endswith("the previous checkpoint (global_step2) and 'latest' are unchanged")
    assert got["listing"] == ["global_step2", "latest"]  # no staged debris, nothing half-committed
    assert fmt.read_latest(tmp_path) == "global_step3"  # the save after it worked
    engine = zero_core.initialize(make_model(), config(2, 1))
    assert engine.load_checkpoint(tmp_path, tag="global_step2")[1] == {"next_batch": 2}
    assert _max_diff(engine.full_state_dict(), got["expected"]) == 0.0
    engine.load_checkpoint(tmp_path)
    assert _max_diff(engine.full_state_dict(), got["after"]) == 0.0


def test_file_size_limit_from_the_os_while_saving(tmp_path):
    """A real EFBIG from the kernel (RLIMIT_FSIZE), through safetensors' own writer."""
    engine = zero_core.initialize(make_model(), config(2, 1))
    _train(engine, 0, 1, range(1))
    engine.save_checkpoint(tmp_path)
    expected = engine.full_state_dict()
    _train(engine, 0, 1, range(1, 2))
    rank_file = (tmp_path / "global_step1" / "rank_00000.safetensors").stat().st_size
    with file_size_limit(rank_file // 2), pytest.raises(CheckpointError) as e:
        engine.save_checkpoint(tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and "could not write" in msg and "file too large" in msg and "free space" in msg
    assert sorted(os.listdir(tmp_path)) == ["global_step1", "latest"]
    fresh = zero_core.initialize(make_model(), config(2, 1))
    fresh.load_checkpoint(tmp_path)
    assert _max_diff(fresh.full_state_dict(), expected) == 0.0
    engine.save_checkpoint(tmp_path)
    assert fmt.read_latest(tmp_path) == "global_step2"


def test_unwritable_save_folder_is_one_line(tmp_path):
    engine = zero_core.initialize(make_model(), config(2, 1))
    engine.save_checkpoint(tmp_path / "ckpt")
    before = snapshot(tmp_path)
    with unwritable(tmp_path / "ckpt"), pytest.raises(CheckpointError) as e:
        engine.save_checkpoint(tmp_path / "ckpt", tag="again")
    msg = str(e.value)
    assert "\n" not in msg and "cannot create" in msg and "make the folder writable" in msg, msg
    assert snapshot(tmp_path) == before


@pytest.fixture(scope="module")
def zbench_ckpt(tmp_path_factory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("src") / "ckpt")


def _full_disk_after(nbytes: int):
    """A StreamingWriter.write that fails with ENOSPC once `nbytes` have gone to the current file."""
    from checkpoints.safetensors_stream import StreamingWriter

    real = StreamingWriter.write

    def write(self, piece):
        if self.bytes_written + piece.numel() * piece.element_size() > nbytes:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, piece)

    return write


@pytest.mark.parametrize("to", ["fp32", "zbench"])
def test_convert_to_a_full_disk_leaves_nothing(zbench_ckpt, tmp_path, monkeypatch, to):
    from checkpoints.safetensors_stream import StreamingWriter

    (tmp_path / "keep.txt").write_text("earlier output")
    before, source = snapshot(tmp_path), snapshot(zbench_ckpt)
    monkeypatch.setattr(StreamingWriter, "write", _full_disk_after(4096))
    args = ["convert", str(zbench_ckpt), "--to", to, "--out", str(tmp_path / "new" / "out")]
    result = cli(*args, *(["--world-size", "2"] if to == "zbench" else []))
    line = one_line_error(result)
    assert "no space left on the device" in line and "free space" in line and "nothing was written" in line, line
    assert snapshot(tmp_path) == before and snapshot(zbench_ckpt) == source


def test_convert_under_an_os_file_size_limit_leaves_nothing(zbench_ckpt, tmp_path):
    before = snapshot(tmp_path)
    with file_size_limit(4096):
        result = cli("convert", zbench_ckpt, "--to", "fp32", "--out", tmp_path / "out")
    line = one_line_error(result)
    assert "file too large" in line, line
    assert snapshot(tmp_path) == before


def test_a_failed_launch_names_the_rank_that_failed_not_the_peers_that_lost_it():
    """A rank that dies under a collective leaves its peers with 'connection closed' errors, which may come first."""
    from types import SimpleNamespace

    from zbench.launch import _cause

    def failure(rank, exitcode, message, when):
        return SimpleNamespace(local_rank=rank, exitcode=exitcode, message=message, timestamp=when)

    lost = failure(0, 1, "RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:1", 10)
    crashed = failure(1, 1, "RuntimeError: injected failure on rank 1", 11)
    error = SimpleNamespace(failures={0: lost, 1: crashed}, get_first_failure=lambda: (0, lost))
    assert _cause(error) == (1, crashed)
    killed = failure(1, -9, "Signal 9 (SIGKILL) received by PID 7", 12)
    assert _cause(SimpleNamespace(failures={0: lost, 1: killed}, get_first_failure=lambda: (0, lost))) == (1, killed)
    only_lost = SimpleNamespace(failures={0: lost}, get_first_failure=lambda: (0, lost))
    assert _cause(only_lost) == (0, lost)  # nothing better to name


def test_a_rank_the_launcher_stopped_is_still_named_from_its_error_file(tmp_path):
    """The agent reports only the failures it saw before stopping the other ranks; a stopped rank that had
    already recorded its own error (error.json beside the reported one) is the cause."""
    from types import SimpleNamespace

    from zbench.launch import _cause

    for rank, message in ((0, "RuntimeError: Connection closed by peer [127.0.0.1]:1"),
                          (1, "RuntimeError: injected failure on rank 1")):
        (tmp_path / str(rank)).mkdir()
        record = {"message": {"message": message, "extraInfo": {"timestamp": "5", "py_callstack": "..."}}}
        (tmp_path / str(rank) / "error.json").write_text(json.dumps(record))
    lost = SimpleNamespace(local_rank=0, exitcode=1, message="RuntimeError: Connection closed by peer [127.0.0.1]:1",
                           timestamp=6, error_file=str(tmp_path / "0" / "error.json"))
    rank, failure = _cause(SimpleNamespace(failures={2: lost}, get_first_failure=lambda: (2, lost)))
    assert (rank, failure.message) == (3, "RuntimeError: injected failure on rank 1")  # node offset kept


def test_a_rank_that_recorded_no_error_is_not_reported_with_torchs_pointer_to_its_docs():
    from zbench.launch import _first_line

    pointer = "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"
    assert _first_line(pointer, "") == "it ended without recording an error and left no log lines"
    assert _first_line(pointer, "Killed") == "it ended without recording an error, its last log lines below"
    assert _first_line("", "") == "it ended without recording an error and left no log lines"
    assert _first_line("RuntimeError: boom\n  at x", "") == "RuntimeError: boom"
