"""The config's `scheduler` section with DeepSpeed 0.19.8's per-group lists (WarmupLR's and WarmupDecayLR's
`warmup_min_lr` / `warmup_max_lr`, OneCycle's `cycle_*_lr` / `cycle_*_mom`, one value per param group) gives
DeepSpeed's lr and betas for each group at every step; a list of the wrong length, and `warmup_num_steps` 0, are
refused as DeepSpeed refuses them (tests/fixtures/deepspeed_config_schedule_lists.json, made by
tests/fixtures/make_dropin_config_schedule_lists.py with the same model, groups and loop)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import zero_core.deepspeed as deepspeed
from zero_core.config_errors import ConfigError
from zero_core.deepspeed.runtime import lr_schedules
from helpers import fixture_script

FIXTURES = Path(__file__).parent / "fixtures"
DEEPSPEED = json.loads((FIXTURES / "deepspeed_config_schedule_lists.json").read_text())
make = fixture_script("make_dropin_config_schedule_lists")


@pytest.mark.parametrize("case", ["warmup_lists", "warmup_one_list", "decay_lists", "onecycle_lists"])
def test_per_group_lists_in_the_config_give_deepspeeds_lrs_and_betas(case):
    got, want = make.trace(deepspeed, make.CASES[case]), DEEPSPEED[case]
    assert len(got) == len(want) == make.STEPS
    for step, ((lrs, betas), (want_lrs, want_betas)) in enumerate(zip(got, want)):
        assert lrs == pytest.approx(want_lrs, rel=1e-12, abs=1e-15), (step, lrs, want_lrs)
        for pair, want_pair in zip(betas, want_betas, strict=True):
            assert pair == pytest.approx(want_pair, rel=1e-12), (step, betas, want_betas)


def test_a_list_of_the_wrong_length_is_one_line_naming_the_fix():
    assert DEEPSPEED["wrong_length"] == {"raises": "ValueError"}
    with pytest.raises(ConfigError, match="scheduler.params.warmup_max_lr has 3 values but the optimizer has 2 param "
                                          "groups; give one value per group, or a single number for all") as e:
        make.trace(deepspeed, make.CASES["wrong_length"])
    assert isinstance(e.value, ValueError) and "\n" not in str(e.value)


def test_a_bad_value_in_a_list_is_named_as_a_single_one_would_be():
    bad = {"type": "WarmupLR", "params": {"warmup_min_lr": [0.0, -1.0], "warmup_max_lr": 0.1}}
    with pytest.raises(ConfigError, match="scheduler.params.warmup_min_lr must be") as e:
        make.trace(deepspeed, bad)
    assert "got -1" in str(e.value) and "[" not in str(e.value) and "\n" not in str(e.value)  # the value, not the list


def test_the_lists_are_reported_as_given():
    net = make.model()
    engine, *_ = deepspeed.initialize(model=net, model_parameters=[{"params": list(net[0].parameters())},
                                                                   {"params": list(net[2].parameters())}],
                                      config=make.config(make.CASES["warmup_lists"]))
    params = engine.scheduler_params()
    assert params["warmup_min_lr"] == [0.01, 0.0] and params["warmup_max_lr"] == [0.1, 0.3]
    assert params["warmup_num_steps"] == 4
    engine.close()


def test_warmup_num_steps_zero_is_a_value_error_as_in_deepspeed():
    assert DEEPSPEED["cosine_no_warmup"] == {"raises": "ValueError"}
    with pytest.raises(ValueError, match="warmup_num_steps must be") as e:
        make.trace(deepspeed, make.CASES["cosine_no_warmup"])
    assert "\n" not in str(e.value)
    opt = torch.optim.AdamW(make.model().parameters(), lr=0.1)
    for build in (lambda: lr_schedules.WarmupCosineLR(opt, total_num_steps=6, warmup_num_steps=0),
                  lambda: lr_schedules.WarmupLR(opt, warmup_num_steps=0),
                  lambda: lr_schedules.WarmupDecayLR(opt, total_num_steps=6, warmup_num_steps=0)):
        with pytest.raises(ValueError, match="warmup_num_steps must be an integer >= 1") as e:
            build()
        assert "\n" not in str(e.value)
