"""transformers' own DeepSpeed helpers at ZeRO stage 3 under `python -m zero_core.deepspeed`: models built by
`from_config` while an `HfDeepSpeedConfig` is alive, as DeepSpeed 0.19.8 builds them (checked on the CPU)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import repo_pythonpath

# transformers enters `prevent_arange_dtype_change` (which replaces DeepSpeed's
# `partition_parameters.zero_wrapper_for_fp_tensor_constructor`) before zero.Init, so a RoPE table asked for in
# fp32 stays fp32 under a bf16 config; DeepSpeed 0.19.8 gives inv_freq fp32, equal to eager construction's.
# `resize_token_embeddings` gathers `[lm_head.weight, lm_head.bias]`, the bias None, as DeepSpeed accepts.
SCRIPT = '''
import torch
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig
from transformers.integrations import HfDeepSpeedConfig
keep = HfDeepSpeedConfig({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
                          "zero_optimization": {"stage": 3}})
llama = LlamaConfig(num_hidden_layers=1, hidden_size=16, intermediate_size=32, num_attention_heads=2,
                    num_key_value_heads=2, vocab_size=64, max_position_embeddings=32)
rope = AutoModelForCausalLM.from_config(llama).model.rotary_emb.inv_freq
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
expected = LlamaRotaryEmbedding(llama).inv_freq
print("rope", rope.dtype, torch.equal(rope, expected))
gpt = AutoModelForCausalLM.from_config(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=64, n_positions=16))
gpt.resize_token_embeddings(72)
print("resized", tuple(gpt.get_output_embeddings().weight.shape), tuple(gpt.get_input_embeddings().weight.shape))
'''


@pytest.mark.slow
def test_from_config_under_hf_deepspeed_config(tmp_path):
    launcher = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in launcher}
    env.update(PYTHONPATH=repo_pythonpath(), CUDA_VISIBLE_DEVICES="")
    script = tmp_path / "build.py"
    script.write_text(SCRIPT)
    run = subprocess.run([sys.executable, "-m", "zero_core.deepspeed", str(script)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "rope torch.float32 True" in run.stdout
    assert "resized (72, 8) (72, 8)" in run.stdout
