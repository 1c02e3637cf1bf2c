"""Ctrl-C and SIGTERM during a real `zbench run` of the quick-start scenario: one line saying how to resume,
exit status 128 + the signal, no traceback, no rank process left, the finished rows untouched, and
`--resume` of the folder then completes the table.

Ctrl-C reaches every process of the terminal's process group (the ranks too); `kill PID` reaches only
zbench, whose launcher must then stop the ranks itself. The signal is sent once the second variant's
ranks are training (seen on stderr, in their progress file and in /proc, never after a fixed delay).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO, file_sha256, table

pytestmark = pytest.mark.slow  # spawned ranks or whole runs: outside the fast tier (-m 'not slow')

SCENARIO = "scenarios/quickstart.yaml"


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            kids += [int(k) for k in f.read().split()]
    return kids


def _group(pgid: int) -> list[int]:
    """Live processes of process group `pgid` (zombies are gone once reaped; they hold nothing)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # exited while we looked
        state, _, group = stat[stat.rindex(")") + 2 :].split()[:3]
        if int(group) == pgid and state != "Z":
            found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _training(run_dir: Path) -> bool:
    """zero1's rank 0 has reported a training step (its progress file, written with or without the bars)."""
    return any(p.stat().st_size for p in run_dir.glob("logs/zero1/progress-*.jsonl"))


@pytest.mark.parametrize("signum,to_group", [(signal.SIGINT, True), (signal.SIGTERM, False)], ids=["ctrl-c", "sigterm"])
def test_interrupted_run_stops_its_ranks_and_resumes(tmp_path, signum, to_group):
    env = {**os.environ, "WANDB_SILENT": "true"}
    cmd = [
        sys.executable,
        "-m",
        "zbench",
        "run",
        SCENARIO,
        "--out",
        str(tmp_path / "runs"),
        "--wandb",
        "off",
        "--no-progress",
    ]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, process_group=0
    )  # its own process group: Ctrl-C's reach, and ours to inspect
    try:
        seen = []
        for line in proc.stderr:
            seen.append(line)
            if line.startswith("[zero1] training"):
                break
        assert seen and seen[-1].startswith("[zero1] training"), "".join(seen)
        run_dir = Path(next(tmp_path.glob("runs/quickstart-*")))
        deadline = time.monotonic() + 120  # a guard against hanging the suite, not a timing assertion
        while not _training(run_dir) and time.monotonic() < deadline:
            time.sleep(0.05)
        ranks = _children(proc.pid)
        assert len(ranks) == 2 and _training(run_dir), ranks
        kept = file_sha256(run_dir / "variants" / "ddp.json")
        if to_group:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signum, err
    assert err.splitlines() == [f"interrupted; resume with: zbench run {SCENARIO} --resume {run_dir}"], err
    assert "Traceback" not in out + err and "results:" not in out
    assert not [pid for pid in ranks if _alive(pid)] and _group(proc.pid) == []  # no rank, nothing it started
    assert file_sha256(run_dir / "variants" / "ddp.json") == kept  # the finished row as it was
    assert not (run_dir / "variants" / "zero1.json").exists()  # the interrupted variant left no row

    printed = shlex.split(err.split("resume with: ", 1)[1])  # the command the user is told to run
    assert printed[:2] == ["zbench", "run"]
    again = subprocess.run(
        [sys.executable, "-m", *printed, "--wandb", "off", "--no-progress"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "[ddp] kept from" in again.stderr and "[ddp] training" not in again.stderr
    rows = table(again.stdout)  # the run folder's table.md, every column
    assert list(rows) == ["ddp", "zero1", "zero2", "zero3", "fsdp2"], again.stdout
    assert [r["Loss parity vs DDP"].split()[-1] for r in rows.values()] == ["reference"] + ["ok"] * 4
    assert file_sha256(run_dir / "variants" / "ddp.json") == kept


def _signal_self(signum):
    """Deliver `signum` to this process now; Python runs its handler before the next line."""

    def hook(*args, **kwargs):
        os.kill(os.getpid(), signum)
        signal.pause()  # not reached: the handler raises first

    return hook


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_between_launches_is_the_same_one_line(tmp_path, monkeypatch, signum):
    """Outside a launch (here: just before the first one) zbench's own handler answers, not torch's agent's."""
    from click.testing import CliRunner

    from zbench.cli import main
    from zbench.runner import Runner

    monkeypatch.chdir(REPO)
    monkeypatch.setattr(Runner, "measure_floor", _signal_self(signum))
    result = CliRunner().invoke(main, ["run", SCENARIO, "--out", str(tmp_path / "runs"), "--wandb", "off"])
    run_dir = next(tmp_path.glob("runs/quickstart-*"))
    assert result.exit_code == 128 + signum, result.output
    assert result.output.splitlines()[-1] == f"interrupted; resume with: zbench run {SCENARIO} --resume {run_dir}"
    assert sorted(p.name for p in run_dir.iterdir()) == [".zbench-run", "scenario.yaml", "variants"]
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the command's handlers are gone with it


def test_a_signal_before_the_run_folder_exists(tmp_path, monkeypatch):
    import zbench.plan
    from click.testing import CliRunner

    from zbench.cli import main

    monkeypatch.chdir(REPO)
    monkeypatch.setattr(zbench.plan, "build_plan", _signal_self(signal.SIGINT))
    result = CliRunner().invoke(main, ["run", SCENARIO, "--out", str(tmp_path / "runs")])
    assert result.exit_code == 130
    assert result.output.splitlines() == [
        f"interrupted before the run started; nothing was written; start again with: zbench run {SCENARIO}"
    ]
    assert not (tmp_path / "runs").exists()


_armed: list[int] = []


def _signal_inside_fork_callback() -> None:
    """An at-fork callback (as logging's own) that a Ctrl-C interrupts: CPython drops what its handler raises."""
    if _armed:
        _armed.clear()
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(3):  # the handler runs here, inside the callback
            pass


os.register_at_fork(after_in_parent=_signal_inside_fork_callback)  # idle until armed


def test_a_signal_dropped_while_forking_a_rank_still_interrupts():
    """Ctrl-C landing while the launcher forks a rank: CPython drops the handler's exception ("Exception
    ignored"); unless it is raised again, the launch and then the next variant would simply go on."""
    from zbench.interrupt import Interrupted, agent_signals, interruptible

    with pytest.raises(Interrupted) as e:
        with interruptible(), agent_signals():
            _armed.append(1)
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
    assert e.value.exit_code == 130
