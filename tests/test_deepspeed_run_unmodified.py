"""`python -m zero_core.deepspeed train.py ...` (and under torchrun): a DeepSpeed script whose imports are left as
they are (`import deepspeed`, `from deepspeed.x import y`) trains as the same script importing zero_core.deepspeed
does; what zero_core does not provide is refused on import in one line; a missing script is one `Error:` line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dist_harness import free_port
from helpers import repo_pythonpath

SCRIPT = '''
import argparse, json
import torch
{imports}

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=-1)
parser.add_argument("--out", required=True)
parser = deepspeed.add_config_arguments(parser)
args = parser.parse_args()
deepspeed.init_distributed()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
scheduler = WarmupLR(optimizer, warmup_min_lr=0.0, warmup_max_lr=1e-2, warmup_num_steps=3, warmup_type="linear")
engine, optimizer, _, scheduler = deepspeed.initialize(args=args, model=model, optimizer=optimizer,
                                                       lr_scheduler=scheduler)
rank, world = engine.global_rank, engine.world_size
data = torch.randn(6, 2 * world, 8, generator=torch.Generator().manual_seed(1))
losses, norms = [], []
for batch in data:
    x = batch[2 * rank : 2 * rank + 2]
    loss = engine(x).pow(2).mean()
    engine.backward(loss)
    norms.append(float(safe_get_full_grad(model[0].weight).norm()))
    engine.step()
    losses.append(float(loss))
if rank == 0:
    json.dump({{"losses": losses, "norms": norms, "lr": scheduler.get_last_lr(),
               "module": deepspeed.__name__}}, open(args.out, "w"))
'''
UNMODIFIED = ("import deepspeed\nfrom deepspeed.runtime.lr_schedules import WarmupLR\n"
              "from deepspeed.utils import safe_get_full_grad")
EXPLICIT = ("import zero_core.deepspeed as deepspeed\nfrom zero_core.deepspeed.runtime.lr_schedules import WarmupLR\n"
            "from zero_core.deepspeed.utils import safe_get_full_grad")
CONFIG = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}, "gradient_clipping": 1.0}


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    return {**env, "PYTHONPATH": repo_pythonpath(), "CUDA_VISIBLE_DEVICES": ""}


def _write(tmp_path, imports: str, name: str):
    script = tmp_path / f"{name}.py"
    script.write_text(SCRIPT.format(imports=imports))
    (tmp_path / "ds_config.json").write_text(json.dumps(CONFIG))
    return script


def _run(cmd: list[str], tmp_path, out: str) -> dict:
    done = subprocess.run(cmd + ["--deepspeed_config", str(tmp_path / "ds_config.json"), "--out", str(tmp_path / out)],
                          capture_output=True, text=True, env=_env(), timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((tmp_path / out).read_text())


@pytest.mark.slow  # two fresh interpreters: outside the fast tier
def test_an_unmodified_script_trains_as_the_one_importing_zero_core(tmp_path):
    unmodified = _write(tmp_path, UNMODIFIED, "train")
    explicit = _write(tmp_path, EXPLICIT, "train_explicit")
    aliased = _run([sys.executable, "-m", "zero_core.deepspeed", str(unmodified)], tmp_path, "aliased.json")
    direct = _run([sys.executable, str(explicit)], tmp_path, "direct.json")
    assert aliased["module"] == "zero_core.deepspeed"
    assert aliased == direct and len(aliased["losses"]) == 6 and aliased["lr"] == [1e-2]


@pytest.mark.slow
def test_an_unmodified_script_under_torchrun(tmp_path):
    unmodified = _write(tmp_path, UNMODIFIED, "train")
    explicit = _write(tmp_path, EXPLICIT, "train_explicit")
    def torchrun() -> list[str]:
        return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", f"--master-port={free_port()}"]

    aliased = _run(torchrun() + ["-m", "zero_core.deepspeed", str(unmodified)], tmp_path, "aliased.json")
    direct = _run(torchrun() + [str(explicit)], tmp_path, "direct.json")
    assert aliased == direct and len(aliased["losses"]) == 6


@pytest.mark.slow  # fresh interpreters: outside the fast tier
@pytest.mark.parametrize("line, words", [
    ("from deepspeed.moe.layer import MoE", "deepspeed.moe is not provided by zero_core"),
    ("from deepspeed.ops.lamb import FusedLamb", "deepspeed.ops.lamb is not provided by zero_core"),
])
def test_what_zero_core_does_not_provide_is_refused_on_import(tmp_path, line, words):
    script = tmp_path / "train.py"
    script.write_text(line + "\n")
    done = subprocess.run([sys.executable, "-m", "zero_core.deepspeed", str(script)], capture_output=True, text=True,
                          env=_env(), timeout=120)
    assert done.returncode == 1 and done.stderr.startswith(f"Error: {words}") and "Traceback" not in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("call, words", [
    ("deepspeed.initialize(model=model, model_parameters=model.parameters(), config={'train_batch_size': 0})",
     "train_batch_size"),
    ("deepspeed.initialize(model=model, model_parameters=model.parameters(), config={'train_batch_size': 1})"
     "[0].load_checkpoint(sys.argv[1], tag='missing')", "missing"),
])
def test_an_uncaught_refusal_is_one_error_line(tmp_path, call, words):
    (tmp_path / "ckpt" / "global_step1").mkdir(parents=True)
    (tmp_path / "ckpt" / "latest").write_text("global_step1")
    script = tmp_path / "train.py"
    script.write_text(f"import sys\nimport torch\nimport deepspeed\nmodel = torch.nn.Linear(2, 2)\n{call}\n")
    done = subprocess.run([sys.executable, "-m", "zero_core.deepspeed", str(script), str(tmp_path / "ckpt")],
                          capture_output=True, text=True, env=_env(), timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: ") and words in last and done.stderr.count("Error: ") == 1


@pytest.mark.slow
def test_a_missing_script_is_one_error_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "zero_core.deepspeed", str(tmp_path / "nope.py")],
                          capture_output=True, text=True, env=_env(), timeout=120)
    assert done.returncode == 2 and done.stderr.startswith("Error: no script at") and done.stderr.count("\n") == 1


def test_activation_checkpointing_answers_under_both_of_deepspeeds_paths():
    """Scripts import DeepSpeed's activation checkpointing as deepspeed.checkpointing or by the module it lives in."""
    import torch

    from zero_core.deepspeed import checkpointing
    from zero_core.deepspeed.runtime.activation_checkpointing import checkpointing as by_path

    assert by_path.checkpoint is checkpointing.checkpoint and by_path.configure is checkpointing.configure
    x = torch.randn(3, requires_grad=True)
    by_path.checkpoint(lambda t: (t * t).sum(), x).backward()
    assert torch.allclose(x.grad, 2 * x)
    checkpointing.configure(None, partition_activations=True)  # over a model-parallel group of one: nothing to do
    assert checkpointing.is_configured()
    checkpointing.configure(None, checkpoint_in_cpu=True)  # taken: tests/test_cpu_checkpointing.py
    checkpointing.configure(None)  # back to the defaults for the rest of the process
