"""`deepspeed.utils.safe_get_full_*` / `safe_set_full_fp32_param` on a parameter frozen after initialize
(`requires_grad_(False)` between steps): at stage 3 every read gives None and a write changes nothing, on one rank
and on two, as DeepSpeed's ZeRO-3 answers; at stage 2 it reads and writes as before it was frozen, as DeepSpeed's
ZeRO-2 does. In both, the engine that trains it goes on updating it from its Adam moments, as DeepSpeed's does."""

from __future__ import annotations

import pytest
import torch
from dist_harness import run_ranks

pytestmark = pytest.mark.slow  # spawned ranks: outside the fast tier

# DeepSpeed 0.19.8 on the CPU (gloo), the script `_frozen_reads` mirrors: sums of the values read (None where it gave
# None). frozen/stepped: [fp32, exp_avg, exp_avg_sq of the frozen weight, fp32 of a trained one], after the step
# before the freeze and after one more step; grads: [frozen, trained] between that step's backward and step();
# unfrozen: the frozen weight's fp32 after writing ones into it and setting requires_grad back to True.
DEEPSPEED = {
    (2, 1): {"frozen": [-1.631648, -0.13109, 0.000177, 0.521018], "grads": [0.0, 2.492581],
             "stepped": [-1.537677, -0.117981, 0.000177, 0.433462], "unfrozen": 48.0},
    (2, 2): {"frozen": [-1.671648, -0.11849, 0.000157, 0.491018], "grads": [0.0, 1.894279],
             "stepped": [-1.604475, -0.106641, 0.000157, 0.37325], "unfrozen": 48.0},
    (3, 1): {"frozen": [None, None, None, 0.521018], "local": None, "grads": [None, 2.492581],
             "stepped": [None, None, None, 0.433462], "unfrozen": -1.537677},
    (3, 2): {"frozen": [None, None, None, 0.491018], "local": None, "grads": [None, 1.894279],
             "stepped": [None, None, None, 0.37325], "unfrozen": -1.604475},
}


def _frozen_reads(rank: int, world: int, stage: int) -> dict:
    import zero_core.deepspeed as deepspeed
    from zero_core.deepspeed.utils import (safe_get_full_fp32_param, safe_get_full_grad,
                                           safe_get_full_optimizer_state, safe_get_local_fp32_param,
                                           safe_set_full_fp32_param)

    def total(t: torch.Tensor | None) -> float | None:
        return None if t is None else round(float(t.double().sum()), 6)

    cfg = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": stage},
           "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}}}
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    g = torch.Generator().manual_seed(1 + rank)
    frozen, trained = engine.module[0].weight, engine.module[2].weight
    out: dict = {}

    def step(grads: str | None = None) -> None:
        x, y = torch.randn(2, 6, generator=g), torch.randn(2, 3, generator=g)
        engine.backward(torch.nn.functional.mse_loss(engine(x), y))
        if grads is not None:
            out[grads] = [total(safe_get_full_grad(frozen)), total(safe_get_full_grad(trained))]
        engine.step()

    def reads(key: str) -> None:
        moments = [safe_get_full_optimizer_state(frozen, k) for k in ("exp_avg", "exp_avg_sq")]
        out[key] = [total(t) for t in (safe_get_full_fp32_param(frozen), *moments, safe_get_full_fp32_param(trained))]

    step()
    frozen.requires_grad_(False)
    reads("frozen")
    if stage == 3:
        out["local"] = total(safe_get_local_fp32_param(frozen))
    step("grads")
    reads("stepped")
    safe_set_full_fp32_param(frozen, torch.ones(8, 6))
    frozen.requires_grad_(True)
    out["unfrozen"] = total(safe_get_full_fp32_param(frozen))
    engine.close()
    return out


@pytest.mark.parametrize("stage, world", sorted(DEEPSPEED))
def test_a_parameter_frozen_after_initialize_reads_as_deepspeeds(stage, world):
    got = run_ranks(_frozen_reads, world, stage)
    want = DEEPSPEED[(stage, world)]
    assert set(got) == set(want)
    for key, values in want.items():
        values = values if isinstance(values, list) else [values]
        seen = got[key] if isinstance(got[key], list) else [got[key]]
        assert [v is None for v in seen] == [v is None for v in values], key
        assert [v for v in seen if v is not None] == pytest.approx([v for v in values if v is not None], abs=2e-6), key
