"""Floating buffers under fp16/bf16, as DeepSpeed 0.19.8 runs them: their own dtype (a rotary table stays fp32),
the working precision for a model built inside init_context, `data_types.buffer_dtype`
for all, and fp32 for those `data_types.keep_in_fp32_modules` names ("auto": transformers' own lists)."""

from __future__ import annotations

import pytest
import torch

import zero_core


class Rotary(torch.nn.Module):
    _keep_in_fp32_modules_strict = ["router"]  # transformers' class attribute: these buffers stay fp32

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, 4, 2).float() / 4)))
        self.register_buffer("router_bias", torch.tensor([5.001, 5.002], dtype=torch.bfloat16))
        self.register_buffer("steps", torch.zeros(1, dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).float().pow(2).mean() + self.inv_freq.sum() * 0


def _dtypes(data_types: dict | None = None, context: bool = False) -> dict[str, torch.dtype]:
    cfg = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": {"stage": 3},
           **({"data_types": data_types} if data_types is not None else {})}
    if context:
        with zero_core.init_context(cfg):
            model = Rotary()
    else:
        model = Rotary()
    engine = zero_core.initialize(model, cfg)
    got = {name: b.dtype for name, b in engine.module.named_buffers()}
    engine.backward(engine(torch.randn(1, 4, device=engine.device, dtype=torch.bfloat16)))  # mixed dtypes train
    engine.step()
    engine.close()
    return got


@pytest.mark.parametrize("data_types, context, inv_freq, router", [
    (None, False, torch.float32, torch.float32),  # own dtypes; "auto" names router_bias: up to fp32
    ({"keep_in_fp32_modules": []}, False, torch.float32, torch.bfloat16),
    ({"buffer_dtype": "bf16", "keep_in_fp32_modules": []}, False, torch.bfloat16, torch.bfloat16),
    ({"buffer_dtype": "fp16"}, False, torch.float16, torch.float32),  # the kept one stays fp32
    (None, True, torch.bfloat16, torch.float32),  # built in init_context: the working precision
    ({"keep_in_fp32_modules": ["inv_*"]}, True, torch.float32, torch.bfloat16),  # a pattern of the user's
])
def test_buffers_run_in_the_dtype_deepspeed_gives_them(data_types, context, inv_freq, router):
    got = _dtypes(data_types, context)
    assert (got["inv_freq"], got["router_bias"], got["steps"]) == (inv_freq, router, torch.int64)
