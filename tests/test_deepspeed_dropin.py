"""The same DeepSpeed training script (tests/dropin_script.py) with `import zero_core.deepspeed as deepspeed`
equals real DeepSpeed 0.19.8 (tests/fixtures/deepspeed_dropin/, made on the CPU by make_dropin_fixtures.py):
Hugging Face-style decay / no-decay groups, WarmupDecayLR from the config or a torch LambdaLR, 10 steps on 2
ranks, a save, a load on 1 rank, 5 more steps; stages 1-3, fp32. Losses and weights within 1e-5: the first 10
steps against DeepSpeed's, the resumed 5 against DeepSpeed's run of the 15 steps without a break (its own
resume from a universal checkpoint equals that at stages 1-2 only; see the fixture script)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import dropin_script
from dist_harness import run_ranks

pytestmark = pytest.mark.slow  # spawned ranks or whole runs: outside the fast tier (-m 'not slow')

FIXTURES = Path(__file__).parent / "fixtures" / "deepspeed_dropin"
REFERENCE = json.loads((FIXTURES / "reference.json").read_text())
TOL = 1e-5


def _run(rank: int, world: int, stage: int, sched: str, ckpt: str, phase: str) -> dict:
    import zero_core.deepspeed as deepspeed

    return dropin_script.run(deepspeed, rank, world, stage, sched, ckpt, phase)


def _close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    assert got.keys() == want.keys()
    return max(float((got[k] - want[k]).abs().max()) for k in want)


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("sched", ["decay", "lambda"])
def test_the_same_script_matches_deepspeed(tmp_path, stage, sched):
    name = f"stage{stage}_{sched}"
    want = REFERENCE["cases"][name]
    weights = load_file(str(FIXTURES / "weights.safetensors"))
    a = run_ranks(_run, 2, stage, sched, str(tmp_path), "a")
    b = run_ranks(_run, 1, stage, sched, str(tmp_path), "b")
    assert a["losses"] == pytest.approx(want["losses_a"], abs=TOL)
    assert b["losses"] == pytest.approx(want["losses_full"][len(a["losses"]):], abs=TOL)
    assert a["lr"] == pytest.approx(want["lr_a"], rel=1e-6) and b["lr"] == pytest.approx(want["lr_b"], rel=1e-6)
    for phase, got in (("a", a), ("full", b)):
        prefix = f"{name}.{phase}."
        reference = {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}
        assert _close(got["weights"], reference) < TOL, phase
