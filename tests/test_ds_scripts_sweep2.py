"""DeepSpeed scripts run unmodified: what DeepSpeed 0.19.8 answers that a script can see (observed with its
`deepspeed` launcher on the CPU, DS_ACCELERATOR=cpu):

- its launcher starts each rank as `python -u train.py --local_rank=N ARGS`: the flag before the script's own
  arguments (a script reading `sys.argv[1]` sees it there);
- `engine.save_checkpoint(...)` returns True;
- with a monitor on and `wall_clock_breakdown: true`, every update writes `Train/Samples/elapsed_time_ms_forward`,
  `_backward`, `_backward_inner`, `_backward_allreduce` and `_step` at `global_samples`, after `Train/Samples/lr`;
- an enabled `flops_profiler` section turns `wall_clock_breakdown` on (its config ORs the two), so the timing
  lines and those events come with it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import zero_core.deepspeed as deepspeed
from zero_core.deepspeed.launcher import LOCAL_RANK_ARG

PHASE_FILES = [f"Train_Samples_elapsed_time_ms_{p}.csv"
               for p in ("backward", "backward_allreduce", "backward_inner", "forward", "step")]


@pytest.mark.slow  # a Python process of its own
def test_a_rank_gets_local_rank_before_the_script_arguments(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import json, os, sys\nopen(os.environ['ARGV_TO'], 'w').write(json.dumps(sys.argv[1:]))\n")
    env = {**os.environ, LOCAL_RANK_ARG: "1", "LOCAL_RANK": "1", "RANK": "1", "WORLD_SIZE": "2",
           "ARGV_TO": str(tmp_path / "argv.json")}
    subprocess.run([sys.executable, "-m", "zero_core.deepspeed", str(script), "a", "--flag", "b"], env=env,
                   check=True, timeout=120)
    assert json.loads((tmp_path / "argv.json").read_text()) == ["--local_rank=1", "a", "--flag", "b"]


def _engine(tmp_path, **extra):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
           "csv_monitor": {"enabled": True, "output_path": str(tmp_path / "monitor"), "job_name": "job"}, **extra}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    return engine


def _train(engine, updates):
    for _ in range(updates * engine.gradient_accumulation_steps()):
        engine.backward(engine(torch.randn(2, 4)).pow(2).mean())
        engine.step()


def test_save_checkpoint_returns_true(tmp_path):
    engine = _engine(tmp_path)
    _train(engine, 1)
    assert engine.save_checkpoint(tmp_path / "ckpt", tag="t") is True
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == "t"
    engine.close()


def _phase_rows(tmp_path):
    job = tmp_path / "monitor" / "job"
    got = sorted(f for f in os.listdir(job) if "elapsed_time_ms" in f)
    assert got == PHASE_FILES
    rows = {f: (job / f).read_text().splitlines() for f in got}
    for f, lines in rows.items():
        assert lines[0] == "step," + f[len("Train_Samples_"):-len(".csv")]
        assert [line.split(",")[0] for line in lines[1:]] == ["4", "8"]  # global_samples after each update
        assert all(float(line.split(",")[1]) >= 0.0 for line in lines[1:])
    return rows


def test_wall_clock_breakdown_writes_the_phase_times_to_the_monitor(tmp_path, capsys):
    engine = _engine(tmp_path, wall_clock_breakdown=True)
    _train(engine, 2)
    rows = _phase_rows(tmp_path)
    # the forward's sum over the window is what the update's last timing line prints
    printed = [line for line in capsys.readouterr().out.splitlines() if "| fwd: " in line]
    assert len(printed) == 2
    assert [f"{float(r.split(',')[1]):.2f}" for r in rows[PHASE_FILES[3]][1:]] == \
        [line.split("| fwd: ")[1].split(" ")[0] for line in printed]
    engine.close()


def test_flops_profiler_turns_the_wall_clock_breakdown_on(tmp_path, capsys):
    engine = _engine(tmp_path, flops_profiler={"enabled": True, "profile_step": 1})
    assert engine.wall_clock_breakdown() is True and engine._config.wall_clock_breakdown is True
    _train(engine, 2)
    _phase_rows(tmp_path)
    assert sum("| fwd: " in line for line in capsys.readouterr().out.splitlines()) == 2
    engine.close()


def test_neither_leaves_the_monitor_with_the_lr_alone(tmp_path):
    engine = _engine(tmp_path)
    assert engine.wall_clock_breakdown() is False
    _train(engine, 2)
    assert os.listdir(tmp_path / "monitor" / "job") == ["Train_Samples_lr.csv"]
    engine.close()
