"""The device-tensor loss scaler against DeepSpeed 0.19.8's own DynamicLossScaler (recorded sequences,
tests/fixtures/deepspeed_loss_scale) and a plain-Python model of its rules."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import FIXTURES
from zero_core.config import load_config
from zero_core.loss_scaler import LossScaler

CPU = torch.device("cpu")


def scaler(**fp16) -> LossScaler:
    cfg = load_config({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True, **fp16}}, 1)
    return LossScaler(cfg, CPU)


class DeepSpeedOracle:
    """DeepSpeed's update_scale rules (deepspeed/runtime/fp16/loss_scaler.py) in plain Python, factor 2."""

    def __init__(self, power, window, hysteresis, consecutive, min_scale):
        self.scale, self.window, self.delayed, self.consecutive, self.min = (
            2.0**power,
            window,
            hysteresis,
            consecutive,
            min_scale,
        )
        self.cur_iter, self.last_overflow, self.hyst = 0, -1, hysteresis

    def update(self, overflow: bool) -> None:
        if overflow:
            if self.delayed == 1 or self.hyst == 1:
                self.scale = max(self.scale / 2, self.min)
            else:
                self.hyst -= 1
            self.last_overflow = self.cur_iter
        else:
            if self.consecutive:
                self.hyst = self.delayed
            stable = self.cur_iter - self.last_overflow - 1
            if stable > 0 and stable % self.window == 0:
                if not self.consecutive:
                    self.hyst = self.delayed
                self.scale *= 2
        self.cur_iter += 1


def test_matches_deepspeeds_recorded_scaler():
    cases = json.loads((FIXTURES / "deepspeed_loss_scale" / "sequences.json").read_text())["cases"]
    assert len(cases) == 21 and any(c["overflows"].count(True) > 2 for c in cases)
    for case in cases:
        s = scaler(**case["fp16"])
        for overflow, (scale, hysteresis, cur_iter, last_overflow) in zip(case["overflows"], case["after"]):
            s.update(torch.tensor([overflow]))
            got = [float(s.scale), int(s.cur_hysteresis), int(s.cur_iter), int(s.last_overflow_iter)]
            assert got == [scale, hysteresis, cur_iter, last_overflow], case["fp16"]


def run(s: LossScaler, overflows: list[bool]) -> list[float]:
    out = []
    for o in overflows:
        s.update(torch.tensor([int(o)], dtype=torch.int32))
        out.append(float(s.scale))
    return out


@settings(max_examples=200, deadline=None)
@given(
    power=st.integers(0, 24),
    window=st.integers(1, 6),
    hysteresis=st.integers(1, 4),
    consecutive=st.booleans(),
    min_scale=st.sampled_from([1.0, 0.25, 2.0**-10, 4.0]),
    overflows=st.lists(st.booleans(), max_size=60),
)
def test_matches_deepspeed_oracle(power, window, hysteresis, consecutive, min_scale, overflows):
    s = scaler(
        initial_scale_power=power,
        loss_scale_window=window,
        hysteresis=hysteresis,
        consecutive_hysteresis=consecutive,
        min_loss_scale=min_scale,
    )
    ref = DeepSpeedOracle(power, window, hysteresis, consecutive, min_scale)
    for o in overflows:
        s.update(torch.tensor([o]))
        ref.update(o)
        assert float(s.scale) == ref.scale and float(s.inv_scale) == pytest.approx(1.0 / ref.scale, rel=1e-7)
        assert int(s.cur_hysteresis) == ref.hyst and int(s.last_overflow_iter) == ref.last_overflow
        assert int(s.cur_iter) == ref.cur_iter


def test_initial_scale():
    s = scaler(initial_scale_power=15)
    assert float(s.scale) == 2.0**15 and float(s.inv_scale) == 2.0**-15
    assert s.scale.shape == (1,) and s.scale.dtype == torch.float32


def test_hysteresis_1_drops_on_the_first_overflow():
    assert run(scaler(initial_scale_power=10, hysteresis=1), [True, True]) == [512.0, 256.0]


def test_hysteresis_2_drops_on_the_second_overflow():
    # and, as in DeepSpeed, the countdown is not refilled after a drop: the third overflow drops again
    assert run(scaler(initial_scale_power=10, hysteresis=2), [True, True, True]) == [1024.0, 512.0, 256.0]


def test_hysteresis_refill_without_consecutive_waits_for_the_window():
    s = scaler(initial_scale_power=10, hysteresis=2, loss_scale_window=3)
    assert run(s, [True, False, True]) == [1024.0, 1024.0, 512.0]  # a good step alone does not refill


def test_consecutive_hysteresis_refills_on_any_good_step():
    s = scaler(initial_scale_power=10, hysteresis=2, loss_scale_window=100, consecutive_hysteresis=True)
    assert run(s, [True, False, True, True]) == [1024.0, 1024.0, 1024.0, 512.0]


def test_growth_after_window_good_steps():
    s = scaler(initial_scale_power=4, loss_scale_window=3, hysteresis=1)
    assert run(s, [False] * 7) == [16.0, 16.0, 16.0, 32.0, 32.0, 32.0, 64.0]
    s = scaler(initial_scale_power=4, loss_scale_window=3, hysteresis=1)
    # after an overflow, the window counts from it: growth on the 4th good step after it
    assert run(s, [True, False, False, False, False]) == [8.0, 8.0, 8.0, 8.0, 16.0]


def test_min_loss_scale_floor_and_counter():
    s = scaler(initial_scale_power=2, hysteresis=1, min_loss_scale=2)
    assert run(s, [True, True, True]) == [2.0, 2.0, 2.0]
    assert int(s.min_scale_overflows) == 2  # newer DeepSpeed would raise here; we count instead


def test_static_and_non_fp16_are_constant():
    static = scaler(loss_scale=128)
    assert run(static, [True, False] * 3) == [128.0] * 6 and float(static.inv_scale) == 1 / 128
    for extra in ({"bf16": {"enabled": True}}, {}):
        cfg = load_config({"train_micro_batch_size_per_gpu": 1, "fp16": {"loss_scale": 64}, **extra}, 1)
        s = LossScaler(cfg, CPU)
        assert run(s, [True, True]) == [1.0, 1.0] and float(s.inv_scale) == 1.0


def test_state_dict_round_trip_keeps_tensor_identity():
    s = scaler(initial_scale_power=8, hysteresis=3, loss_scale_window=2)
    run(s, [True, False, True, False, False])
    sd = s.state_dict()
    t = scaler(initial_scale_power=8, hysteresis=3, loss_scale_window=2)
    scale_ref, inv_ref = t.scale, t.inv_scale
    t.load_state_dict({k: (v.tolist()[0] if k == "cur_iter" else v) for k, v in sd.items()})  # numbers work too
    assert t.scale is scale_ref and t.inv_scale is inv_ref
    assert float(t.scale) == float(s.scale) and float(t.inv_scale) == 1.0 / float(s.scale)
    for more in ([True], [False, False], [True, True, True]):
        assert run(t, more) == run(s, more)


def test_update_is_device_only(monkeypatch):
    s = scaler(initial_scale_power=8, hysteresis=2, loss_scale_window=2)

    def boom(*_a, **_k):
        raise AssertionError("host sync in LossScaler.update")

    for name in ("item", "__bool__", "__float__", "__int__", "tolist"):
        monkeypatch.setattr(torch.Tensor, name, boom)
    for o in (1, 0, 0, 1):
        s.update(torch.tensor([o], dtype=torch.int32))
    s.update(torch.tensor(True))  # 0-d bool is fine too
