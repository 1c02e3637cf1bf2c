"""bf16 training through `zero_core.deepspeed` equals real DeepSpeed 0.19.8's (tests/fixtures/deepspeed_bf16/, made
on the CPU by tests/fixtures/make_bf16_fixtures.py): tests/bf16_script.py at ZeRO stages 0-3, with gradient
clipping off, at DeepSpeed's default (1.0) and at 0.3, on 1 and 2 gloo ranks, 1 and 2 micro-steps per step.

The losses after every step within 2e-6 and the same bf16 weights after 4 steps (within 1e-6): a gradient scaled
by a clip coefficient an fp32 ulp off already rounds some bf16 weights the other way (1e-4 in the loss). The
gradient norms: at stage 3 DeepSpeed's fp64 norm within 1e-12; at stages 1-2 within an fp32 ulp (DeepSpeed cuts
the partition at other elements, so each rank's fp32 sum of squares may round differently); at stage 0 within 5e-7
(DeepSpeed's bf16 wrapper adds up fp32 norms of each parameter).

At stage 0 the reference is DeepSpeed's run without the optimizer step its bf16 wrapper takes at construction
(the fixture script says why zero_core does not copy it).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import bf16_script
from dist_harness import run_ranks

FIXTURES = Path(__file__).parent / "fixtures" / "deepspeed_bf16"
REFERENCE = json.loads((FIXTURES / "reference.json").read_text())["cases"]


def _train(rank: int, world: int, cases: list[tuple]) -> list[dict]:
    import zero_core.deepspeed as deepspeed

    return [bf16_script.run(deepspeed, rank, world, stage, clip, accum) for stage, clip, _, accum in cases]


def _reference_name(case: tuple) -> str:
    name = bf16_script.case_name(*case)
    return name + "_without_init_step" if case[0] == 0 else name


@pytest.mark.slow  # 24 engines on spawned ranks
@pytest.mark.parametrize("world", [1, 2])
def test_bf16_training_equals_deepspeed(world):
    cases = [c for c in bf16_script.CASES if c[2] == world]
    weights = load_file(str(FIXTURES / "weights.safetensors"))
    for case, got in zip(cases, run_ranks(_train, world, cases), strict=True):
        name = _reference_name(case)
        want = REFERENCE[name]
        assert got["losses"] == pytest.approx(want["losses"], abs=2e-6), f"{name}: losses"
        norm_tol = dict(rel={0: 5e-7, 3: 1e-12}.get(case[0], 1.2e-7))
        assert got["norms"] == pytest.approx(want["norms"], **norm_tol), f"{name}: gradient norms"
        for key, value in got["weights"].items():
            diff = float((value - weights[f"{name}.{key}"].float()).abs().max())
            assert diff < 1e-6, f"{name}: {key} is {diff:.3g} from DeepSpeed's"


def test_the_stage3_norm_is_an_fp64_tensor_as_deepspeeds():
    import zero_core.deepspeed as deepspeed

    for stage, dtype in ((2, torch.float32), (3, torch.float64)):
        net = torch.nn.Linear(4, 2).to(torch.bfloat16)
        engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config={
            "train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True}, "zero_optimization": {"stage": stage},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})
        engine.backward(engine(torch.ones(2, 4, dtype=torch.bfloat16)).float().pow(2).mean())
        engine.step()
        assert engine.get_global_grad_norm().dtype == dtype
        engine.close()
