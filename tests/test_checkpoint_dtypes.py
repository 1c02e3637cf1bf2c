"""Every dtype safetensors stores goes through a checkpoint: a model's complex64 rotary table (torchtitan's
`freqs_cis`), unsigned and float8 buffers save, resume and convert as they were; a dtype safetensors cannot store
(complex128) stops the save in one line naming the tensor, with nothing written."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

import zero_core
from checkpoints.source import CheckpointError
from helpers import cli

CONFIG = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
          "zero_optimization": {"stage": 2}}


class WithBuffers(torch.nn.Module):
    def __init__(self, rotary: torch.dtype = torch.complex64) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        angles = torch.arange(16, dtype=torch.float64).reshape(8, 2) / 7
        self.register_buffer("freqs_cis", torch.polar(torch.ones_like(angles), angles).to(rotary))
        self.register_buffer("counts", torch.tensor([1, 2, 60000], dtype=torch.int32).to(torch.uint16))
        self.register_buffer("scale8", torch.tensor([0.5, 2.0]).to(torch.float8_e5m2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).pow(2).mean() + self.freqs_cis.real.sum().float() * 0


def _trained(model: torch.nn.Module):
    engine = zero_core.initialize(model, CONFIG)
    engine.backward(engine(torch.randn(2, 4, generator=torch.Generator().manual_seed(0)).to(engine.device)))
    engine.step()
    return engine


def test_complex_unsigned_and_float8_buffers_save_resume_and_convert(tmp_path):
    engine = _trained(WithBuffers())
    want = {k: v.clone() for k, v in engine.module.named_buffers()}
    engine.save_checkpoint(tmp_path / "ck")
    engine.close()
    fresh = zero_core.initialize(WithBuffers(), CONFIG)
    for b in fresh.module.buffers():
        b.zero_()
    fresh.load_checkpoint(tmp_path / "ck")
    for k, b in fresh.module.named_buffers():
        assert b.dtype == want[k].dtype and torch.equal(b.cpu().view(torch.uint8), want[k].cpu().view(torch.uint8)), k
    fresh.close()
    result = cli("convert", tmp_path / "ck", "--to", "fp32", "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    out = load_file(str(tmp_path / "out" / "model.safetensors"))
    want = {k: v.cpu() for k, v in want.items()}
    assert out["freqs_cis"].dtype == torch.complex64 and torch.equal(out["freqs_cis"], want["freqs_cis"])
    assert out["counts"].dtype == torch.uint16 and torch.equal(out["counts"], want["counts"])
    assert torch.equal(out["scale8"], want["scale8"].float())  # a float: --to fp32 casts it


def test_a_dtype_safetensors_cannot_store_stops_the_save_in_one_line(tmp_path):
    engine = _trained(WithBuffers(rotary=torch.complex128))
    with pytest.raises(CheckpointError) as e:
        engine.save_checkpoint(tmp_path / "ck")
    assert "'freqs_cis' has dtype complex128, which safetensors cannot store" in str(e.value)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "ck").exists() or not any((tmp_path / "ck").iterdir())  # nothing written
    engine.close()
