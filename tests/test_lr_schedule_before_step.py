"""`get_last_lr()` before any `step()`, as DeepSpeed 0.19.8's `deepspeed.runtime.lr_schedules` answer it: WarmupLR,
WarmupDecayLR, WarmupCosineLR and LRRangeTest built afresh report the lrs written at construction; OneCycle, and any
of them resumed at a `last_batch_iteration`, raise DeepSpeed's AssertionError ("need to call step() first"), as one
line; after one `step()` every one reports its lrs.

tests/fixtures/deepspeed_lr_schedule_before_step.json, made by tests/fixtures/make_lr_schedule_before_step.py with
the same schedules and calls. Where zero_core differs: the scheduler `initialize` builds from the config's `scheduler`
section (zero_core/optim/facade.py's EngineScheduler) reports its next update's lrs before the first step at every
schedule, where DeepSpeed's raises as above (the fixture's `*_config*` cases)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import fixture_script

DEEPSPEED = json.loads((Path(__file__).parent / "fixtures" / "deepspeed_lr_schedule_before_step.json").read_text())
make = fixture_script("make_lr_schedule_before_step")


def _same(seen: dict, expected: dict, where: str) -> None:
    if "raises" in expected:
        assert seen.get("raises") == expected["raises"], (where, seen)
        assert expected["message"] in seen["message"] and "\n" not in seen["message"], (where, seen)
    else:
        assert seen.get("lr") == pytest.approx(expected["lr"], rel=1e-6), (where, seen)


@pytest.mark.parametrize("kind", list(make.SCHEDULES))
@pytest.mark.parametrize("resumed", [False, True])
def test_get_last_lr_before_and_after_the_first_step_is_deepspeeds(kind, resumed):
    from zero_core.deepspeed.runtime import lr_schedules

    case = f"{kind}_{'resumed' if resumed else 'fresh'}"
    got = make.direct(lr_schedules, kind, resumed)
    for point in ("before_step", "after_step"):
        _same(got[point], DEEPSPEED[case][point], f"{case} {point}")
