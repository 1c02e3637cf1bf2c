"""Small engine and config calls of `zero_core.deepspeed` beside DeepSpeed 0.19.8's answers for the same script
(tests/fixtures/ds_dropin_engine_apis.json, made by tests/fixtures/make_ds_dropin_engine_apis.py, whose functions
run here on zero_core):

- `"enabled": "auto"` under fp16 / bf16 in a config no trainer filled: DeepSpeed drops the "auto" and trains in
  fp32 without a word; zero_core refuses in one line naming DeepSpeed's reading and the fix.
- client optimizers DeepSpeed does not list: the same refusals at stages 1-3 without `zero_allow_untested_optimizer`
  and the same weights with it, except where docs/deepspeed.md says (torch's element-wise optimizers need no key
  here; at stage 0, where DeepSpeed asks for none, zero_core asks for it, as it steps flat shards there too).
- `micro_steps` and the other counters around `load_checkpoint`: DeepSpeed's at every point, the micro-step count
  never loaded.
- `get_lr()`: DeepSpeed's values; Python floats, where DeepSpeed's hold the config's int until a schedule computes
  one."""

from __future__ import annotations

import json

import pytest

import zero_core.deepspeed as deepspeed
from helpers import fixture_script

make = fixture_script("make_ds_dropin_engine_apis")
DEEPSPEED = json.loads(make.PATH.read_text())
KEY = "zero_allow_untested_optimizer"


def test_precision_auto_trains_in_fp32_on_deepspeed_and_is_refused_here():
    for name, theirs in DEEPSPEED["precision_auto"].items():
        assert theirs == {"fp16_enabled": False, "bf16_enabled": False, "weights": "torch.float32"}
    for name, ours in make.precision_auto(deepspeed).items():
        message = ours["refused"]
        assert "\n" not in message
        assert message == (f'{name}.enabled is "auto", which only a trainer fills (DeepSpeed 0.19.8 reads it as false '
                           "and trains in fp32); set it to true or false")


def test_precision_auto_in_a_config_file_and_under_the_older_bf16_name(tmp_path):
    net = make._net()
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "bfloat16": {"enabled": "auto"}}))
    with pytest.raises(ValueError, match=r'^bfloat16\.enabled is "auto", which only a trainer fills'):
        deepspeed.initialize(model=net, model_parameters=net.parameters(), config=str(path))
    cfg = {"train_micro_batch_size_per_gpu": 2, "fp16": {"enabled": False}, "bf16": {"enabled": "true"},
           "optimizer": make.ADAMW}
    engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=cfg)
    assert engine.bfloat16_enabled()  # "true" is true, on both


def _expected_untested(case: str, theirs: dict) -> dict:
    """DeepSpeed's answer for `case`, or zero_core's where docs/deepspeed.md says it differs."""
    kind, stage, allow = case.split(", ")
    stage_n, keyed = int(stage.split()[1]), allow == "allow True"
    known_elementwise = kind in ("SGD", "config SGD")  # torch's SGD, run on flat shards at DeepSpeed's numbers
    if "refused" in theirs and known_elementwise:
        return DEEPSPEED["untested_optimizer"][case.replace("allow None", "allow True")]
    if stage_n == 0 and not keyed and not known_elementwise:
        return {"refused": KEY}  # zero_core steps flat shards at stage 0 too, so it asks for the key there as well
    if stage_n == 0 and kind == "LayerwiseSGD":
        # a flat shard's norm: DeepSpeed's stage 1 answer, which its stage 0 (per parameter) does not give
        return DEEPSPEED["untested_optimizer"][f"{kind}, stage 1, {allow}"]
    return theirs


@pytest.mark.parametrize("case", sorted(DEEPSPEED["untested_optimizer"]))
def test_untested_optimizers_are_taken_and_refused_as_documented(case):
    kind, stage, allow = case.split(", ")
    ours = make.untested_case(deepspeed, kind, int(stage.split()[1]), {"allow None": None, "allow True": True}[allow])
    want = _expected_untested(case, DEEPSPEED["untested_optimizer"][case])
    if "refused" in want:
        assert "refused" in ours, ours
        assert KEY in ours["refused"] and "\n" not in ours["refused"]
    else:
        assert "output" in ours, ours
        assert ours["output"] == pytest.approx(want["output"], abs=1e-6)


def test_counters_around_load_checkpoint_are_deepspeeds(tmp_path):
    ours = make.counters_after_load(deepspeed, str(tmp_path))
    theirs = DEEPSPEED["counters_after_load"]
    assert sorted(ours) == sorted(theirs)
    for case, points in theirs.items():
        assert points["new_engine_loaded"]["micro_steps"] == 0  # DeepSpeed never loads the micro-step count
        for point, counters in points.items():
            assert ours[case][point] == counters, (case, point)


def test_get_lr_gives_deepspeeds_values_as_python_floats():
    ours, theirs = make.get_lr(deepspeed), DEEPSPEED["get_lr"]
    assert sorted(ours) == sorted(theirs)
    for schedule, points in theirs.items():
        for point, typed in points.items():
            assert [v for _, v in ours[schedule][point]] == pytest.approx([v for _, v in typed], abs=1e-12)
            assert {t for t, _ in ours[schedule][point]} == {"float"}, (schedule, point)
            # DeepSpeed's groups hold the config's own number until something computes one: an int where the
            # config wrote one (lr 1; warmup_min_lr / cycle_min_lr 0 before the first step), equal to our float
            computed = point.startswith("after_") and schedule not in ("none", "none, lr 1")
            config_int = schedule == "none, lr 1" or (schedule in ("WarmupLR", "WarmupDecayLR", "OneCycle")
                                                     and not computed)
            assert {t for t, _ in typed} == ({"int"} if config_int else {"float"}), (schedule, point)
