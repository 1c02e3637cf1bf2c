"""`accelerate launch` with a DEEPSPEED config file, DeepSpeed not installed: `python -m
zero_core.integrations.accelerate_launch --config_file ... script.py` starts the config's 2 processes, each running
the script with zero_core answering `import deepspeed`; a script importing Accelerate's `Accelerator` and one
importing zero_core's train as DeepSpeed 0.19.8 + Accelerate 1.15 trained the same script under `accelerate
launch` on the CPU (ZeRO-2, gradient_accumulation_steps 2, gradient_clipping 1.0 from the config file; rank 0's
loss per micro-batch and clip_grad_norm_'s norm per update, the values of test_accelerate_host_processes.py's
loop). ZeroTrainer's `TrainingArguments` without `deepspeed=` take the config the launcher exported, as
transformers' do."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import one_line_error, repo_pythonpath

pytest.importorskip("accelerate")

CONFIG = """compute_environment: LOCAL_MACHINE
distributed_type: DEEPSPEED
deepspeed_config:
  gradient_accumulation_steps: 2
  gradient_clipping: 1.0
  zero_stage: 2
mixed_precision: 'no'
num_machines: 1
num_processes: 2
main_process_port: 0
"""

SCRIPT = """import json
import torch
from accelerate.utils import InitProcessGroupKwargs
IMPORT

acc = Accelerator(kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")])
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
opt = torch.optim.AdamW(model.parameters(), lr=0.01)
gen = torch.Generator().manual_seed(5)
pairs = torch.utils.data.TensorDataset(torch.randn(16, 6, generator=gen), 3 * torch.randn(16, 3, generator=gen))
model, opt, loader = acc.prepare(model, opt, torch.utils.data.DataLoader(pairs, batch_size=2))
rows = []
for x, y in loader:
    with acc.accumulate(model):
        loss = (model(x) - y).pow(2).mean()
        acc.backward(loss)
        norm = acc.clip_grad_norm_(model.parameters(), 1.0) if acc.sync_gradients else None
        opt.step()
        opt.zero_grad()
    rows.append([float(loss), norm])
acc.print("ROWS", json.dumps({"rows": rows, "processes": acc.num_processes,
                              "stage": acc.state.deepspeed_plugin.zero_stage}))
"""


def _env() -> dict:
    launcher = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in launcher and not k.startswith("ACCELERATE_")}
    return {**env, "PYTHONPATH": repo_pythonpath(), "CUDA_VISIBLE_DEVICES": ""}


@pytest.mark.slow  # two launches of 2 processes importing Accelerate
@pytest.mark.parametrize("accelerator", ["from accelerate import Accelerator",
                                         "from zero_core.integrations.accelerate import Accelerator"])
def test_a_deepspeed_config_file_launches_on_zero_core(tmp_path, accelerator):
    (tmp_path / "config.yaml").write_text(CONFIG)
    (tmp_path / "train.py").write_text(SCRIPT.replace("IMPORT", accelerator))
    done = subprocess.run([sys.executable, "-m", "zero_core.integrations.accelerate_launch", "--config_file",
                           str(tmp_path / "config.yaml"), str(tmp_path / "train.py")],
                          capture_output=True, text=True, env=_env(), timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("ROWS "))[5:])
    assert (got["processes"], got["stage"]) == (2, 2)
    assert [r[0] for r in got["rows"]] == pytest.approx([7.381869, 0.810312, 9.318196, 7.88207], abs=2e-6)
    assert [r[1] for r in got["rows"]] == pytest.approx([None, 1.706087, None, 3.030156], abs=2e-6)


def test_a_config_of_several_machines_is_refused_in_one_line(tmp_path):
    (tmp_path / "config.yaml").write_text(CONFIG.replace("num_machines: 1", "num_machines: 2\nmachine_rank: 0\n"
                                                         "main_process_ip: 127.0.0.1"))
    (tmp_path / "train.py").write_text("print('started')\n")
    done = subprocess.run([sys.executable, "-m", "zero_core.integrations.accelerate_launch", "--config_file",
                           str(tmp_path / "config.yaml"), str(tmp_path / "train.py")],
                          capture_output=True, text=True, env=_env(), timeout=300, cwd=tmp_path)
    assert "2 machines" in one_line_error(done) and "started" not in done.stdout


def test_trainer_arguments_take_the_launchers_deepspeed_config(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from zero_core.integrations.transformers import TrainingArguments

    for name, value in {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3",
                        "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "2", "ACCELERATE_GRADIENT_CLIPPING": "0.5"}.items():
        monkeypatch.setenv(name, value)
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], gradient_accumulation_steps=2,
                             max_grad_norm=0.5)
    assert args.zero_config["zero_optimization"]["stage"] == 3
    assert (args.zero_config["gradient_accumulation_steps"], args.zero_config["gradient_clipping"]) == (2, 0.5)
    assert args.deepspeed is None and getattr(args, "deepspeed_plugin", None) is None  # DeepSpeed stays off
    assert os.environ["ACCELERATE_USE_DEEPSPEED"] == "true"  # hidden from transformers only while it read them
