"""An fp16 DeepSpeed checkpoint's dynamic loss scale goes on in zero_core where DeepSpeed's own resume takes it: the
scale after each later step equals the one DeepSpeed 0.19.8 reached from the same checkpoint (tests/fixtures/
deepspeed_fp16/{2,3}, ZeRO-2 and ZeRO-3 on 2 CPU ranks, recorded by make_deepspeed_fp16_fixtures.py)."""

from __future__ import annotations

import json

import pytest
import torch
from dist_harness import run_ranks

from helpers import FIXTURES, fixture_script

fp16_fixtures = fixture_script("make_deepspeed_fp16_fixtures")


def _resume_and_train(rank: int, world: int, saved: int, stage: int) -> dict:
    import zero_core.deepspeed as deepspeed

    torch.manual_seed(0)
    model = fp16_fixtures.Tiny()
    model.norm.weight.requires_grad_(False)
    config = {"train_micro_batch_size_per_gpu": 4 // world, "fp16": fp16_fixtures.FP16,
              "zero_optimization": {"stage": stage},
              "optimizer": {"type": "AdamW", "params": {"lr": 0.05, "weight_decay": 0.01}}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
                                      config=config)
    engine.load_checkpoint(FIXTURES / "deepspeed_fp16" / str(saved))
    gen = torch.Generator().manual_seed(fp16_fixtures.CONTINUE_SEED)
    scales, losses = [], []
    for _ in range(fp16_fixtures.CONTINUE_STEPS):
        batch = torch.randint(0, 11, (4, 5), generator=gen)
        loss = engine(batch[rank * 4 // world : (rank + 1) * 4 // world])
        engine.backward(loss)
        engine.step()
        mean = loss.detach().float().clone()
        if world > 1:
            torch.distributed.all_reduce(mean)
        losses.append(float(mean) / world)
        scales.append(float(engine.scaler.scale))
    engine.close()
    return {"scales": scales, "losses": losses}


@pytest.mark.parametrize("saved, stage, world", [(2, 2, 1), (3, 1, 1), pytest.param(2, 3, 2, marks=pytest.mark.slow)])
def test_the_loss_scale_goes_on_as_deepspeeds_resume_takes_it(saved, stage, world):
    want = json.loads((FIXTURES / "deepspeed_fp16" / str(saved) / "continued.json").read_text())
    got = run_ranks(_resume_and_train, world, saved, stage) if world > 1 else _resume_and_train(0, 1, saved, stage)
    assert got["scales"] == want["loss_scales"]  # 512 from the checkpoint, doubled on DeepSpeed's schedule
    assert got["losses"] == pytest.approx(want["losses"], rel=2e-3)  # fp16 forward
