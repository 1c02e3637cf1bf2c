"""The engine passes the model's own attributes through where it has none, as DeepSpeed's engine does: scripts call
`model.generate(...)`, `model.gradient_checkpointing_enable()` or `model.transformer` on what `initialize` or
Accelerate's `prepare` returned. The engine's own attributes win, and a name neither has is an AttributeError."""

from __future__ import annotations

import pytest
import torch

import zero_core.deepspeed as deepspeed


class _Generator(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(4, 4)
        self.temperature = 0.7
        self.config = "the model's config"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def generate(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x).argmax(-1)


def test_the_models_attributes_pass_through_and_the_engines_own_win():
    model = _Generator()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config={"train_micro_batch_size_per_gpu": 1,
                                              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})
    x = torch.randn(2, 4)
    assert torch.equal(engine.generate(x), model.generate(x))
    assert engine.body is model.body and engine.temperature == 0.7
    assert engine.config is not model.config  # the engine's own config
    with pytest.raises(AttributeError, match="no attribute 'nowhere'"):
        engine.nowhere
    assert not hasattr(engine, "nowhere")
    engine.close()
