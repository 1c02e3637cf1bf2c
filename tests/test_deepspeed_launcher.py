"""`python -m zero_core.deepspeed --num_gpus 2 train.py ...`: DeepSpeed's launcher options on one node. The ranks
start through torch's elastic launcher, each script gets `--local_rank=N` (unless `--no_local_rank`), `--module`
runs a module; devices are picked as DeepSpeed's `--include`/`--exclude`/`--num_gpus` pick them; what needs other
nodes is refused in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dist_harness import free_port
from helpers import repo_pythonpath
from zero_core.deepspeed.launcher import LaunchError, devices, launcher_parser

SCRIPT = '''
import argparse, json, os, sys
import deepspeed
p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
{local_rank}
a = p.parse_args()
deepspeed.init_distributed()
import torch.distributed as dist
json.dump({{"rank": dist.get_rank(), "world": dist.get_world_size(), "argv": sys.argv[1:],
           "module": deepspeed.__name__}}, open(f"{{a.out}}.{{dist.get_rank()}}", "w"))
'''


def _parse(*argv: str):
    return launcher_parser().parse_args([*argv, "train.py"])


@pytest.mark.parametrize("argv, available, expected", [
    ((), 4, [0, 1, 2, 3]),
    (("--num_gpus", "2"), 4, [0, 1]),
    (("--num_gpus=3",), 4, [0, 1, 2]),
    (("--include", "localhost:1,3"), 4, [1, 3]),
    (("-i", "localhost"), 2, [0, 1]),
    (("--exclude", "localhost:0"), 3, [1, 2]),
    (("--include", "localhost:2,3", "--num_gpus", "1"), 4, [2]),
])
def test_devices_are_picked_as_deepspeeds_options_pick_them(argv, available, expected):
    assert devices(_parse(*argv), available) == expected


@pytest.mark.parametrize("argv, available, named", [
    (("--include", "localhost:0", "--exclude", "localhost:1"), 4, "mutually exclusive"),
    (("--include", "worker-1:0"), 4, "worker-1"),
    (("--include", "localhost:5"), 4, "[5]"),
    (("--include", "localhost:a"), 4, "integers"),
    (("--exclude", "localhost"), 2, "no device left"),
    (("--num_gpus", "0"), 2, "at least 1"),
])
def test_bad_device_choices_are_one_line_refusals(argv, available, named):
    with pytest.raises(LaunchError, match=None) as refused:
        devices(_parse(*argv), available)
    assert named in str(refused.value) and "\n" not in str(refused.value)


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    return {**env, "PYTHONPATH": repo_pythonpath(), "CUDA_VISIBLE_DEVICES": ""}


def _run(tmp_path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zero_core.deepspeed", *argv], capture_output=True, text=True,
                          env=_env(), timeout=300, cwd=tmp_path)


@pytest.mark.parametrize("argv", [("--num_nodes", "2"), ("-H", "hostfile"), ("--node_rank", "1"), ("--no_ssh",),
                                  ("--launcher", "slurm"), ("--no_python",), ("--bogus",), ()])
def test_what_this_runner_cannot_do_is_one_error_line(tmp_path, argv, capsys, monkeypatch):
    from zero_core.deepspeed.__main__ import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("open('ran', 'w').close()\n")
    code = main(["--num_gpus", "1", *argv, *(["train.py"] if argv else [])])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("Error: ") and err.count("\n") == 1, err
    assert not (tmp_path / "ran").exists()  # refused before any rank started


@pytest.mark.slow  # starts ranks through the elastic launcher
def test_num_gpus_starts_that_many_ranks_each_given_its_local_rank(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT.format(local_rank='p.add_argument("--local_rank", type=int)'))
    done = _run(tmp_path, "--num_gpus=2", "--master_port", str(free_port()), "train.py", "--out", "r")
    assert done.returncode == 0, done.stderr[-3000:]
    got = [json.loads((tmp_path / f"r.{rank}").read_text()) for rank in (0, 1)]
    assert [g["world"] for g in got] == [2, 2]
    assert [g["argv"] for g in got] == [["--local_rank=0", "--out", "r"], ["--local_rank=1", "--out", "r"]]
    assert got[0]["module"] == "zero_core.deepspeed"  # `import deepspeed` answered by the shim in each rank


@pytest.mark.slow
def test_module_and_no_local_rank_run_a_module_with_its_own_arguments(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text(SCRIPT.format(local_rank=""))  # no --local_rank: argparse refuses it
    done = _run(tmp_path, "--module", "--no_local_rank", "--master_port", str(free_port()), "pkg.train",
                "--out", "m")
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads((tmp_path / "m.0").read_text())
    assert got["world"] == 1 and got["argv"] == ["--out", "m"]


@pytest.mark.slow
def test_a_failing_rank_gives_its_exit_status_and_no_launcher_traceback(tmp_path):
    (tmp_path / "train.py").write_text("import os, sys\nsys.exit(3 if os.environ['RANK'] == '1' else 0)\n")
    done = _run(tmp_path, "--num_gpus", "2", "--master_port", str(free_port()), "train.py")
    assert done.returncode == 3, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "exitcode" not in done.stderr, done.stderr[-3000:]


@pytest.mark.slow
def test_ctrl_c_stops_the_ranks_with_one_error_line(tmp_path):
    import signal
    import time

    (tmp_path / "train.py").write_text("import os, time\nopen(f\"started.{os.environ['RANK']}\", 'w').close()\n"
                                       "time.sleep(120)\nopen('finished', 'w').close()\n")
    launcher = subprocess.Popen([sys.executable, "-m", "zero_core.deepspeed", "--num_gpus", "2", "--master_port",
                                 str(free_port()), "train.py"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=_env(), cwd=tmp_path)
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"started.{r}").exists() for r in (0, 1)) and time.monotonic() < deadline:
        time.sleep(0.2)
    launcher.send_signal(signal.SIGINT)
    _, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 130, err[-3000:]
    assert err.strip().splitlines() == ["Error: interrupted; the ranks were stopped"], err[-3000:]
    assert not (tmp_path / "finished").exists()
