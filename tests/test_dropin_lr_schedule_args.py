"""`deepspeed.runtime.lr_schedules` built by a script with DeepSpeed 0.19.8's per-group lists (WarmupLR's and
WarmupDecayLR's `warmup_min_lr` / `warmup_max_lr`, OneCycle's `cycle_*_lr` / `cycle_*_mom`, one value per param
group) writes DeepSpeed's lr and betas into each group at every step, and WarmupCosineLR's `get_lr_ratio()` is
DeepSpeed's (tests/fixtures/deepspeed_lr_schedule_args.json, made by tests/fixtures/make_dropin_lr_schedule_args.py
with the same optimizer and loop)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zero_core.deepspeed.runtime import lr_schedules
from helpers import fixture_script

FIXTURES = Path(__file__).parent / "fixtures"
DEEPSPEED = json.loads((FIXTURES / "deepspeed_lr_schedule_args.json").read_text())
make = fixture_script("make_dropin_lr_schedule_args")


@pytest.mark.parametrize("case", ["warmup_lists", "warmup_one_list", "decay_lists", "onecycle_lists"])
def test_per_group_lists_give_deepspeeds_lrs_and_betas(case):
    kind, args = make.CASES[case]
    got, want = make.trace(lr_schedules, kind, args), DEEPSPEED[case]
    assert len(got) == len(want)
    for step, (g, w) in enumerate(zip(got, want)):
        for (lr, betas), (want_lr, want_betas) in zip(g, w, strict=True):
            assert lr == pytest.approx(want_lr, rel=1e-12, abs=1e-15), (step, g, w)
            assert list(betas) == pytest.approx(want_betas, rel=1e-12), (step, g, w)


def test_a_list_of_the_wrong_length_is_a_value_error():
    assert DEEPSPEED["wrong_length"] == {"raises": "ValueError"}
    kind, args = make.CASES["wrong_length"]
    with pytest.raises(ValueError, match="warmup_max_lr has 3 values but the optimizer has 2 param groups") as e:
        make.trace(lr_schedules, kind, args)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("warmup_type", ["log", "linear"])
def test_warmup_cosine_get_lr_ratio_is_deepspeeds(warmup_type):
    got = make.ratios(lr_schedules, warmup_type)
    assert got == pytest.approx(DEEPSPEED[f"cosine_ratio_{warmup_type}"], rel=1e-12, abs=1e-15)
