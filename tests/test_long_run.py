"""Reliability battery, long run: `zbench run` trains 240 steps on 2 CPU ranks, checkpointing every 40;
one rank is SIGKILLed in the middle of step 130, and `--resume` continues from step 120. The resumed
run ends bit for bit where a run that never stopped ends: parameters, Adam moments, loss curve and the
count of NaN-skipped steps (a NaN loss is injected at step 50 into both). About 25 s on 2 cores.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from helpers import run_dir, table, write_scenario, zbench
import pytest

pytestmark = pytest.mark.slow  # spawned ranks or whole runs: outside the fast tier (-m 'not slow')

STEPS, EVERY, KILL_AT, NAN_AT = 240, 40, 130, 50
QUIET = ("--wandb", "off", "--no-progress")


def test_long_run_killed_mid_step_resumes_bit_identical(tmp_path):
    micro = tmp_path / "micro.json"
    micro.write_text(
        json.dumps(
            {"family": "gpt", "config": {"vocab_size": 128, "block_size": 32, "n_layer": 2, "n_head": 2, "n_embd": 32}}
        )
    )
    scenario = {
        "name": "long",
        "model": {"arch": str(micro)},
        "data": {"synthetic": {"train_samples": 64, "eval_samples": 8}},
        "seq_len": 16,
        "steps": STEPS,
        "batch_size": 4,
        "lr": 1e-3,
        "gpus": 2,
        "checkpoint_every": EVERY,
        "variants": [
            {"name": "straight", "engine": "zero", "stage": 3},
            {"name": "victim", "engine": "zero", "stage": 3},
        ],
    }
    path = write_scenario(tmp_path, scenario, "long")

    first = zbench(
        "run",
        path,
        "--out",
        str(tmp_path / "runs"),
        *QUIET,
        faults=f"nan-at-step-{NAN_AT},kill-at-step-{KILL_AT}:victim",
    )
    run = run_dir(first.stdout)
    ckpts = Path(run) / "checkpoints"
    victim_row = " | ".join(table(first.stdout)["victim"].values())
    # whichever the launcher saw first: the SIGKILLed rank (an OOM-killer suspect, exit 0) or rank 0's error
    # about its vanished peer (a failed row, exit 1); never a finished variant
    if "SIGKILLed" in victim_row:
        assert first.returncode == 0, first.stderr[-3000:]
    else:
        assert "a peer rank closed its connection" in victim_row and first.returncode == 1, first.stderr[-3000:]
    assert (ckpts / "victim" / "latest").read_text().strip() == f"global_step{KILL_AT // EVERY * EVERY}"

    resumed = zbench("run", path, "--resume", run, *QUIET)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "[straight] kept from" in resumed.stderr and "[victim] training" in resumed.stderr
    rows = {v["variant"]: v for v in json.load(open(f"{run}/results.json"))["variants"]}
    a, b = rows["straight"], rows["victim"]
    assert a["status"] == b["status"] == "ok"
    assert len(a["losses"]) == STEPS and a["losses"] == b["losses"]  # exact, not approximately
    assert a["skipped_steps"] == b["skipped_steps"] == 1
    for rank in (0, 1):
        name = f"global_step{STEPS}/rank_0000{rank}.safetensors"
        x, y = load_file(ckpts / "straight" / name), load_file(ckpts / "victim" / name)
        assert x.keys() == y.keys() == {"master", "exp_avg", "exp_avg_sq"}
        for key in x:
            assert x[key].view(torch.int32).equal(y[key].view(torch.int32)), (rank, key)  # bit for bit
