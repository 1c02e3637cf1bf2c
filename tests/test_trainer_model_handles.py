"""What fine-tuning scripts (LLaVA, FastChat, Alpaca-style) reach for after `trainer.train()` on zero_core's Trainer,
as on DeepSpeed's: `trainer.deepspeed` is the engine, and `trainer.accelerator.get_state_dict(trainer.model_wrapped)`
gives the model's own keys (not the engine's `module.`-prefixed ones), which `save_pretrained(state_dict=...)` then
writes loadably; `unwrap_model` of the engine is the model."""

from __future__ import annotations

import torch
import transformers
from test_integration_transformers import _trainer


def test_the_accelerator_of_zero_cores_trainer_knows_the_engine(tmp_path):
    trainer = _trainer(tmp_path, "003_zero1.json")
    trainer.train()
    engine = trainer.model_wrapped
    assert trainer.deepspeed is engine and trainer.accelerator.unwrap_model(engine) is trainer.model
    state = trainer.accelerator.get_state_dict(engine)
    assert state.keys() == trainer.model.state_dict().keys()
    full = engine.full_state_dict()
    assert all(torch.equal(v, full[k]) for k, v in state.items())
    trainer.model.save_pretrained(tmp_path / "saved", state_dict=state)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "saved")
    assert all(torch.equal(v, full[k].to(v.dtype)) for k, v in reloaded.state_dict().items())
