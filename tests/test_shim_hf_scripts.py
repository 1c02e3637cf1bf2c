"""Hugging Face scripts that use DeepSpeed through transformers or Accelerate, run under `python -m
zero_core.deepspeed`: their DeepSpeed version checks find the shim's (importlib.metadata), and a run of one
process gets the process group they expect from a launcher."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import repo_pythonpath

METADATA_CHECKS = '''
import importlib.metadata as md
import sys
try:
    before = md.version("deepspeed")
except md.PackageNotFoundError:
    before = None
from zero_core.deepspeed.alias import install
install()
from accelerate.utils import is_deepspeed_available as accelerate_has_deepspeed
from lightning_utilities.core.imports import RequirementCache
from transformers.integrations import is_deepspeed_available as transformers_has_deepspeed
print(before, md.version("deepspeed"), md.metadata("deepspeed")["Name"], transformers_has_deepspeed(),
      accelerate_has_deepspeed(), bool(RequirementCache("deepspeed>=0.16.0")))
'''

HF_DEEPSPEED_CONFIG = '''
from transformers.integrations import HfDeepSpeedConfig
ds = HfDeepSpeedConfig({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3}})
print("zero3", ds.is_zero3())
'''

TRAINER = '''
import sys
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
config = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
          "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}, "zero_optimization": {"stage": 3}}
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16))
tokens = [torch.randint(0, 64, (8,), generator=torch.Generator().manual_seed(i)) for i in range(8)]
data = [{"input_ids": t, "labels": t} for t in tokens]
args = TrainingArguments(output_dir=sys.argv[1], deepspeed=config, per_device_train_batch_size=2, max_steps=3,
                         learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True)
trainer = Trainer(model=model, args=args, train_dataset=data)
result = trainer.train()
print("trained", result.global_step, type(trainer.model_wrapped).__module__, flush=True)
'''

ACCELERATOR = '''  # its plugin writes "steps_per_print": inf into the config
import torch
from accelerate import Accelerator, DeepSpeedPlugin
plugin = DeepSpeedPlugin(hf_ds_config={"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
                                       "zero_optimization": {"stage": 2}})
accelerator = Accelerator(deepspeed_plugin=plugin)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
pairs = torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 1))
model, optimizer, loader = accelerator.prepare(model, optimizer, torch.utils.data.DataLoader(pairs, batch_size=2))
steps = 0
for x, y in loader:
    accelerator.backward((model(x) - y).pow(2).mean())
    optimizer.step()
    optimizer.zero_grad()
    steps += 1
print("trained", steps, type(model).__module__, accelerator.distributed_type.value, flush=True)
'''


def _env() -> dict:
    launcher = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in launcher and not k.startswith("ACCELERATE_")}
    return {**env, "PYTHONPATH": repo_pythonpath(), "CUDA_VISIBLE_DEVICES": ""}


def _run(cmd: list[str], tmp_path) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def _run_script(tmp_path, text: str) -> str:
    script = tmp_path / "train.py"
    script.write_text(text)
    return _run([sys.executable, "-m", "zero_core.deepspeed", str(script), str(tmp_path / "out")], tmp_path)


@pytest.mark.slow  # a fresh interpreter importing transformers, Accelerate and Lightning
def test_the_shims_distribution_is_found_only_once_it_is_installed(tmp_path):
    before, version, name, transformers_has, accelerate_has, lightning_has = _run(
        [sys.executable, "-c", METADATA_CHECKS], tmp_path).split()
    assert before == "None", "a real DeepSpeed is installed in this environment"
    assert (version, name) == ("0.19.8", "deepspeed")
    assert transformers_has == accelerate_has == lightning_has == "True"


@pytest.mark.slow
def test_hf_deepspeed_config_runs_under_the_shim(tmp_path):
    assert _run_script(tmp_path, HF_DEEPSPEED_CONFIG) == "zero3 True"


@pytest.mark.slow
def test_trainer_with_a_deepspeed_config_trains_on_the_shim_in_one_process(tmp_path):
    assert _run_script(tmp_path, TRAINER) == "trained 3 zero_core.engine"


@pytest.mark.slow
def test_accelerator_with_a_deepspeed_plugin_trains_on_the_shim_in_one_process(tmp_path):
    assert _run_script(tmp_path, ACCELERATOR) == "trained 4 zero_core.engine DEEPSPEED"
