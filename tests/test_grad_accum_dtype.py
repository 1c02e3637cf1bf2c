"""bf16 with gradient accumulation: the dtype gradients add up in across micro-steps, as DeepSpeed 0.19.8's.

Unset (DeepSpeed's default: the working precision), gradients accumulate in bf16 at every stage; with
`data_types.grad_accum_dtype: "fp32"` in fp32, and stages 0-1 then reduce the fp32 sums in the communication
dtype (bf16), as DeepSpeed's stage 1 does. The recorded numbers are DeepSpeed 0.19.8's (DS_ACCELERATOR=cpu,
torch 2.13 CPU) for the same model, data and config: torch.manual_seed(0); Linear(32, 64), Tanh, Linear(64, 8)
cast to bf16; 8 micro-steps of 4 samples (generator seeded 1 + rank), mse_loss in fp32, 4 micro-steps per step,
AdamW lr 0.01 (`torch_adam`). Each entry: (that micro-step's loss, get_global_grad_norm() after step()).
"""

from __future__ import annotations

import pytest
import torch

from config_helpers import error
from dist_harness import run_ranks

from zero_core import load_config

BF16_SUMS = [(1.64795, None), (1.03237, None), (1.21649, None), (1.44901, 0.934603), (1.07144, 0.934603),
             (1.57471, 0.934603), (1.29081, 0.934603), (1.38058, 0.994968)]  # DeepSpeed, stages 1-3, unset
# DeepSpeed, stages 2-3 with "fp32": each micro-step's bf16 reduction added into an fp32 partition
FP32_SUMS = [(1.64795, None), (1.03237, None), (1.21649, None), (1.44901, 0.934623), (1.06964, 0.934623),
             (1.57389, 0.934623), (1.29114, 0.934623), (1.38139, 0.994378)]
# DeepSpeed, stage 1 with "fp32": the fp32 sums rounded to bf16 by the reduction (also with optimizer offload).
# At stage 0 DeepSpeed refuses the mix (NotImplementedError: unsupported mix of model_dtype and grad_accum_dtype);
# zero_core's stage 0 accumulates as its stage 1 does.
FP32_SUMS_REDUCED = [(1.64795, None), (1.03237, None), (1.21649, None), (1.44901, 0.934633), (1.06964, 0.934633),
                     (1.57389, 0.934633), (1.29114, 0.934633), (1.38139, 0.994326)]
# DeepSpeed, 2 ranks (gloo): stage 2 unset and "fp32", stage 1 "fp32"; rank 0's entries
TWO_RANKS = {
    (2, None): [(1.64795, None), (1.03237, None), (1.21649, None), (1.44901, 0.677553), (1.08268, 0.677553),
                (1.57367, 0.677553), (1.32627, 0.677553), (1.41008, 0.704832)],
    (2, "fp32"): [(1.64795, None), (1.03237, None), (1.21649, None), (1.44901, 0.677506), (1.08351, 0.677506),
                  (1.57334, 0.677506), (1.32639, 0.677506), (1.41086, 0.704975)],
    (1, "fp32"): [(1.64795, None), (1.03237, None), (1.21649, None), (1.44901, 0.677372), (1.08135, 0.677372),
                  (1.57435, 0.677372), (1.32674, 0.677372), (1.41062, 0.704899)],
}


def _config(stage: int, accum: str | None, offload: bool = False) -> dict:
    zero: dict = {"stage": stage}
    if offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4, "bf16": {"enabled": True},
           "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}}, "zero_optimization": zero}
    if accum is not None:
        cfg["data_types"] = {"grad_accum_dtype": accum}
    return cfg


def _train(rank: int, world: int, configs: list[dict]) -> list[list[tuple]]:
    import zero_core.deepspeed as deepspeed

    runs = []
    for cfg in configs:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8)).to(torch.bfloat16)
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
        g = torch.Generator().manual_seed(1 + rank)
        out = []
        for _ in range(8):
            x = torch.randn(4, 32, generator=g).bfloat16()
            y = torch.randn(4, 8, generator=g).bfloat16()
            loss = torch.nn.functional.mse_loss(engine(x).float(), y.float())
            engine.backward(loss)
            engine.step()
            norm = engine.get_global_grad_norm()
            out.append((float(loss), None if norm is None else float(norm)))
        engine.close()
        runs.append(out)
    return runs


def _agree(got: list[tuple], want: list[tuple], what: str) -> None:
    for i, ((loss, norm), (ds_loss, ds_norm)) in enumerate(zip(got, want, strict=True)):
        assert loss == pytest.approx(ds_loss, abs=6e-6), f"{what}: loss of micro-step {i}"
        assert (norm is None) == (ds_norm is None), f"{what}: norm of micro-step {i}"
        if norm is not None:
            assert norm == pytest.approx(ds_norm, abs=6e-7), f"{what}: norm of micro-step {i}"


CASES = [  # (stage, grad_accum_dtype, optimizer offload, DeepSpeed's numbers)
    (0, None, False, BF16_SUMS), (1, None, False, BF16_SUMS), (2, None, False, BF16_SUMS), (3, None, False, BF16_SUMS),
    (0, "fp32", False, FP32_SUMS_REDUCED), (1, "fp32", False, FP32_SUMS_REDUCED), (2, "fp32", False, FP32_SUMS),
    (3, "fp32", False, FP32_SUMS), (2, "bf16", False, BF16_SUMS),
    (1, None, True, BF16_SUMS), (2, None, True, BF16_SUMS), (3, None, True, BF16_SUMS),
    (1, "fp32", True, FP32_SUMS_REDUCED), (2, "fp32", True, FP32_SUMS), (3, "fp32", True, FP32_SUMS),
]


def test_one_rank_accumulates_as_deepspeed_at_every_stage():
    runs = run_ranks(_train, 1, [_config(stage, accum, offload) for stage, accum, offload, _ in CASES])
    for (stage, accum, offload, want), got in zip(CASES, runs, strict=True):
        # stage 0's norms are DeepSpeed's; its losses after the first update are not (DeepSpeed's stage-0 bf16
        # optimizer updates differently), so there only the norms and the first window's losses are compared
        if stage == 0 and accum is None:
            want = [(w[0], w[1]) if i < 4 else (got[i][0], w[1]) for i, w in enumerate(want)]
        _agree(got, want, f"stage {stage}, grad_accum_dtype={accum}, offload={offload}")


def test_two_ranks_accumulate_as_deepspeed():
    cases = list(TWO_RANKS)
    runs = run_ranks(_train, 2, [_config(stage, accum) for stage, accum in cases])
    for (stage, accum), got in zip(cases, runs, strict=True):
        _agree(got, TWO_RANKS[(stage, accum)], f"2 ranks, stage {stage}, grad_accum_dtype={accum}")


def test_the_dtype_defaults_to_the_working_precision_and_another_16_bit_one_is_refused():
    assert load_config(_config(2, None), 1).grad_accum_dtype == torch.bfloat16
    assert load_config(_config(2, "float32"), 1).grad_accum_dtype == torch.float32
    assert load_config(_config(2, "bfloat16"), 1).grad_accum_dtype == torch.bfloat16
    assert error(_config(2, "fp16"), 1) == (
        "data_types.grad_accum_dtype='fp16' is neither the working precision 'bf16' (set by fp16/bf16.enabled) nor "
        "'fp32'; set one of those or remove it")


def test_get_data_types_names_the_accumulation_dtype():
    import zero_core.deepspeed as deepspeed

    for accum, expected in ((None, torch.bfloat16), ("fp32", torch.float32)):
        cfg = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
               "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
               "data_types": {"grad_accum_dtype": accum} if accum else {}}
        engine, *_ = deepspeed.initialize(model=torch.nn.Linear(4, 2), config=cfg)
        assert engine.get_data_types() == (torch.bfloat16, expected)
