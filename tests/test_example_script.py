"""A DeepSpeed example-style script (tests/example_script.py) runs with `import zero_core.deepspeed as deepspeed`,
as a plain process and under torchrun with 2 ranks: DeepSpeed's arguments, the engine's dataloader, the
accelerator, rank and precision queries, deepspeed.comm, log_dist, a checkpoint with client state and its reload."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dist_harness import free_port

SCRIPT = Path(__file__).parent / "example_script.py"
CONFIG = {
    "train_micro_batch_size_per_gpu": 8,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.01, "warmup_num_steps": 4}},
    "bf16": {"enabled": True},
    "zero_optimization": {"stage": 2},
}


def _run(tmp_path: Path, ranks: int) -> dict:
    (tmp_path / "ds_config.json").write_text(json.dumps(CONFIG))
    args = [str(SCRIPT), "--deepspeed", "--deepspeed_config", str(tmp_path / "ds_config.json"), "--save",
            str(tmp_path / "ckpt")]
    launcher = [sys.executable] if ranks == 1 else [sys.executable, "-m", "torch.distributed.run",
                                                    f"--nproc_per_node={ranks}", f"--master_port={free_port()}"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[1]), env.get("PYTHONPATH", "")])
    done = subprocess.run(launcher + args, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    # the ranks' own lines come first in stderr, the launcher's traceback last: show both, and stdout's end
    assert done.returncode == 0, (done.stderr[:3000], done.stderr[-1000:], done.stdout[-1500:])
    assert "[Rank 0] epoch 1 loss" in done.stdout  # log_dist on rank 0
    return json.loads(next(line for line in done.stdout.splitlines() if line.startswith('{"world"')))


@pytest.mark.slow  # a subprocess per rank count (3.5 s at 1 rank on 2 cores)
@pytest.mark.parametrize("ranks", [1, 2])
def test_a_deepspeed_example_script_runs_unchanged_but_for_its_import(tmp_path, ranks):
    got = _run(tmp_path, ranks)
    assert (got["world"], got["dp"], got["micro"]) == (ranks, ranks, 8)
    assert got["steps"] == 2 * 64 // (8 * ranks)  # two epochs of the engine's dataloader (a sampler per rank)
    assert got["seen"] == 16.0  # every rank's steps (16 alone, 8 each on 2), summed by deepspeed.comm.all_reduce
    # the saved key, after DeepSpeed's own entries, as DeepSpeed's load returns them (checkpoint_client_state.py)
    assert got["client"]["epoch"] == 2 and list(got["client"])[-1] == "epoch" and "global_samples" in got["client"]
    assert math.isfinite(got["first"]) and math.isfinite(got["last"])
