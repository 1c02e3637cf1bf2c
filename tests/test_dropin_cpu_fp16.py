"""On the CPU, `get_accelerator().is_fp16_supported()` and `supported_dtypes()` answer as DeepSpeed 0.19.8's CPU
accelerator (from whether oneDNN has fp16 kernels for this CPU), and so `deepspeed.zero.Init(dtype=...)` without a
config builds the dtype DeepSpeed's builds: `dtype` itself (fp16 when None) on a CPU with those kernels, bf16 on
one without (tests/fixtures/deepspeed_cpu_fp16.json, made by tests/fixtures/make_dropin_cpu_fp16.py). The CPU's
answer is set to the recorded one, so the comparison holds on any machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import zero_core.deepspeed as deepspeed
from zero_core.deepspeed.accelerator import get_accelerator
from helpers import fixture_script

FIXTURES = Path(__file__).parent / "fixtures"
DEEPSPEED = json.loads((FIXTURES / "deepspeed_cpu_fp16.json").read_text())
make = fixture_script("make_dropin_cpu_fp16")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU accelerator's answers")
def test_fp16_answers_and_zero_init_dtypes_are_deepspeeds(monkeypatch):
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_fp16_supported", lambda: DEEPSPEED["mkldnn_fp16"])
    assert get_accelerator().device_name() == "cpu"
    want = {k: DEEPSPEED[k] for k in ("is_fp16_supported", "supported_dtypes", "zero_init_dtype")}
    assert make.answers(deepspeed) == want


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU accelerator's answers")
def test_a_cpu_without_fp16_kernels_builds_bf16(monkeypatch):
    """DeepSpeed's rule where oneDNN has no fp16 (its accelerator answers no): bf16 whatever `dtype` says."""
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_fp16_supported", lambda: False)
    got = make.answers(deepspeed)
    assert got["is_fp16_supported"] is False and got["supported_dtypes"] == ["torch.float32", "torch.bfloat16"]
    assert set(got["zero_init_dtype"].values()) == {"torch.bfloat16"}
