"""A script that ends while zero_core's host update still runs exits cleanly, with the update finished."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from helpers import REPO

# The offloaded update runs on after step() (stages/host_step_overlap.py). It is slowed here by in-place torch ops,
# which take the GIL back on return: a daemon thread doing that while Python exits aborts the process (rc 134).
SCRIPT = textwrap.dedent(
    """
    import sys, threading, torch
    import zero_core.deepspeed as deepspeed
    from zero_core.optim.host_adam import HostAdamW

    chunks, marker = HostAdamW._chunks, sys.argv[1]

    def slow_chunks(self, *args, **kwargs):
        assert threading.current_thread().name == "zero_core-host-step"
        work = torch.ones(20_000_000)
        for _ in range(20):
            work.mul_(1.0)
        chunks(self, *args, **kwargs)
        open(marker, "w").write(threading.current_thread().name)

    HostAdamW._chunks = slow_chunks
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    config = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
              "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
              "zero_core": {"overlap_weight_gather": True}}  # the host update runs on after step()
    engine, *_ = deepspeed.initialize(model=model, config=config, model_parameters=model.parameters())
    loss = engine(torch.randn(2, 16)).pow(2).mean()
    engine.backward(loss)
    engine.step()
    print("stepped", flush=True)
    """
)


@pytest.mark.slow  # seconds of subprocess launches: the full suite runs it
def test_a_script_ending_during_the_host_update_exits_cleanly_after_it(tmp_path):
    script, marker = tmp_path / "train.py", tmp_path / "update_finished"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(marker)], capture_output=True, text=True, cwd=REPO,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "terminate called" not in done.stderr
    assert done.stdout.strip().endswith("stepped")
    assert marker.read_text() == "zero_core-host-step"  # the update ran on its thread and was waited for
