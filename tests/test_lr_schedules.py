"""LR schedules: DeepSpeed's WarmupLR / WarmupDecayLR numbers, as device-tensor functions of applied updates."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import FIXTURES
from zero_core.config import load_config
from zero_core.lr_schedules import LrSchedule, make_lr_schedule

MIN, MAX, W, T = 1e-5, 1e-3, 10, 30


def schedule(kind: str, warmup_type: str, **params: object) -> LrSchedule:
    p = {"warmup_min_lr": MIN, "warmup_max_lr": MAX, "warmup_num_steps": W, "warmup_type": warmup_type, **params}
    if kind == "WarmupDecayLR":
        p.setdefault("total_num_steps", T)
    cfg = load_config(
        {
            "train_micro_batch_size_per_gpu": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": 0.5}},
            "scheduler": {"type": kind, "params": p},
        },
        1,
    )
    return make_lr_schedule(cfg)


def at(fn: LrSchedule, n: float) -> float:
    return float(fn(torch.tensor(float(n))))


class DeepSpeedOracle:
    """Plain-Python model of DeepSpeed: the scheduler object plus when the engine steps it.

    __init__ with last_batch_iteration == -1 writes warmup_min_lr into the optimizer (otherwise the
    optimizer keeps its own lr); each applied (non-overflow) update is followed by step(), which
    increments last_batch_iteration and recomputes the lr.
    """

    def __init__(self, opt_lr, lo, hi, warmup, warmup_type, total=None, last=-1):
        self.lo, self.hi, self.warmup, self.type, self.total, self.last = (
            lo,
            hi,
            max(2, warmup),
            warmup_type,
            total,
            last,
        )
        self.lr = lo if last == -1 else opt_lr

    def _gamma(self) -> float:
        it = self.last
        if it < self.warmup:
            return math.log(it + 1) / math.log(self.warmup) if self.type == "log" else it / self.warmup
        if self.total is None:
            return 1.0
        return max(0.0, (self.total - it) / max(1.0, self.total - self.warmup))

    def step(self) -> None:
        self.last += 1
        self.lr = self.lo + (self.hi - self.lo) * self._gamma()


# Hand-computed: update n runs at scheduler iteration n - 1; update 0 uses warmup_min_lr.
LOG9 = math.log(9) / math.log(10)
HAND = {
    ("WarmupLR", "log"): {0: MIN, 1: MIN, W - 1: MIN + (MAX - MIN) * LOG9, W: MAX, T: MAX, T + 5: MAX},
    ("WarmupLR", "linear"): {
        0: MIN,
        1: MIN,
        W - 1: MIN + (MAX - MIN) * 0.8,
        W: MIN + (MAX - MIN) * 0.9,
        W + 1: MAX,
        T: MAX,
        T + 5: MAX,
    },
    ("WarmupDecayLR", "log"): {
        0: MIN,
        1: MIN,
        W - 1: MIN + (MAX - MIN) * LOG9,
        W: MAX,
        W + 1: MIN + (MAX - MIN) * 1.0,
        T: MIN + (MAX - MIN) * (1 / 20),
        T + 5: MIN,
    },
    ("WarmupDecayLR", "linear"): {
        0: MIN,
        1: MIN,
        W - 1: MIN + (MAX - MIN) * 0.8,
        W: MIN + (MAX - MIN) * 0.9,
        W + 2: MIN + (MAX - MIN) * (19 / 20),
        T: MIN + (MAX - MIN) * (1 / 20),
        T + 5: MIN,
    },
}


@pytest.mark.parametrize("kind, warmup_type", list(HAND))
def test_hand_computed_values(kind, warmup_type):
    fn = schedule(kind, warmup_type)
    for n, want in HAND[(kind, warmup_type)].items():
        assert at(fn, n) == pytest.approx(want, rel=1e-6, abs=1e-12), (n, want)


def test_literal_numbers():
    log_lr = schedule("WarmupLR", "log")
    assert at(log_lr, 9) == pytest.approx(9.547000843e-4, rel=1e-7)
    decay = schedule("WarmupDecayLR", "linear")
    assert at(decay, 30) == pytest.approx(5.95e-5, rel=1e-6) and at(decay, 35) == pytest.approx(1e-5, rel=1e-6)


def test_no_scheduler_is_the_optimizer_lr():
    fn = make_lr_schedule(
        load_config({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "Adam", "params": {"lr": 3e-4}}}, 1)
    )
    for n in (0, 1, 1000):
        assert at(fn, n) == pytest.approx(3e-4, rel=1e-7)
    default = make_lr_schedule(load_config({"train_micro_batch_size_per_gpu": 1}, 1))
    assert at(default, 7) == pytest.approx(1e-3, rel=1e-7)


def test_one_fp32_lr_per_group_on_the_applied_counters_device():
    fn = schedule("WarmupDecayLR", "log")
    for x in (torch.tensor(3.0), torch.zeros(1)):
        out = fn(x)
        assert out.shape == (1,) and out.dtype == torch.float32 and out.device == x.device
    cfg = load_config({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {"lr": 0.5}}}, 1)
    assert make_lr_schedule(cfg, [0.5, 0.25, 0.1])(torch.zeros(1)).tolist() == pytest.approx([0.5, 0.25, 0.1])


def test_no_host_sync(monkeypatch):
    def boom(*_a, **_k):
        raise AssertionError("host sync in an lr schedule")

    for name in ("item", "__bool__", "__float__", "__int__", "tolist", "cpu"):
        monkeypatch.setattr(torch.Tensor, name, boom)
    for kind in ("WarmupLR", "WarmupDecayLR"):
        for wt in ("log", "linear"):
            schedule(kind, wt)(torch.zeros(1))


def test_warmup_shorter_than_two_is_clamped():
    fn = schedule("WarmupLR", "linear", warmup_num_steps=1)  # DeepSpeed refuses 0; 1 is clamped to 2
    assert [at(fn, n) for n in range(4)] == pytest.approx([MIN, MIN, MIN + (MAX - MIN) * 0.5, MAX], rel=1e-6)


def test_resume_offset_uses_optimizer_lr_first():
    fn = schedule("WarmupLR", "linear", last_batch_iteration=4)
    assert at(fn, 0) == pytest.approx(0.5)  # DeepSpeed leaves the optimizer's lr in place on a resume
    assert at(fn, 1) == pytest.approx(MIN + (MAX - MIN) * 5 / W, rel=1e-6)


def test_overflow_steps_do_not_advance_the_schedule():
    """The engine feeds APPLIED updates; DeepSpeed skips scheduler.step() on an overflow step."""
    fn = schedule("WarmupDecayLR", "log")
    oracle = DeepSpeedOracle(0.5, MIN, MAX, W, "log", total=T)
    applied = torch.zeros(1)
    overflows = [True, False, False, True, True, False] + [False] * 40
    for over in overflows:
        assert float(fn(applied)) == pytest.approx(oracle.lr, rel=1e-6, abs=1e-12)
        if not over:
            applied += 1
            oracle.step()


@settings(max_examples=150, deadline=None)
@given(
    kind=st.sampled_from(["WarmupLR", "WarmupDecayLR"]),
    warmup_type=st.sampled_from(["log", "linear"]),
    lo=st.floats(0, 1e-2),
    hi=st.floats(0, 1e-1),
    warmup=st.integers(1, 40),  # DeepSpeed refuses 0
    extra=st.integers(0, 60),
    last=st.sampled_from([-1, -1, 0, 7]),
)
def test_matches_deepspeed_oracle(kind, warmup_type, lo, hi, warmup, extra, last):
    total = warmup + extra + 1 if kind == "WarmupDecayLR" else None
    params = {
        "warmup_min_lr": lo,
        "warmup_max_lr": hi,
        "warmup_num_steps": warmup,
        "warmup_type": warmup_type,
        "last_batch_iteration": last,
    }
    if total is not None:
        params["total_num_steps"] = total
    cfg = load_config(
        {
            "train_micro_batch_size_per_gpu": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": 0.25}},
            "scheduler": {"type": kind, "params": params},
        },
        1,
    )
    fn = make_lr_schedule(cfg)
    oracle = DeepSpeedOracle(0.25, lo, hi, warmup, warmup_type, total=total, last=last)
    for n in range(warmup + extra + 10):
        assert at(fn, n) == pytest.approx(oracle.lr, rel=1e-6, abs=1e-12), n
        oracle.step()


# -- against DeepSpeed's own scheduler classes (tests/fixtures/make_lr_fixtures.py) ---------------------------
def _deepspeed_cases():
    import json

    data = json.loads((FIXTURES / "deepspeed_lr" / "schedules.json").read_text())
    return data, [pytest.param(c, id=f"{c['type']}-{i}") for i, c in enumerate(data["cases"])]


DS_DATA, DS_CASES = _deepspeed_cases()


@pytest.mark.parametrize("case", DS_CASES)
def test_every_schedule_matches_deepspeed_per_group_and_update(case):
    """Both groups' lr (and beta1) of every update equal DeepSpeed's: device schedules to fp32 rounding,
    host schedules (OneCycle) exactly."""
    from zero_core.host_schedules import OneCycle

    cfg = load_config(
        {
            "train_micro_batch_size_per_gpu": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
            "scheduler": {"type": case["type"], "params": case["params"]},
        },
        1,
    )
    lrs, betas = DS_DATA["group_lrs"], DS_DATA["betas"]
    if case["type"] == "OneCycle":
        host = OneCycle(cfg.scheduler.params, lrs, [betas[0]] * len(lrs))
        for n, want in enumerate(case["updates"]):
            got_lr, got_betas = host.values(n)
            assert got_lr == want["lr"], n
            assert [b1 for b1, _ in got_betas or [betas] * len(lrs)] == want["beta1"], n
            assert all(b2 == 0.99 for _, b2 in got_betas or ()), n  # DeepSpeed's beta2 while it cycles momentum
        return
    fn = make_lr_schedule(cfg, lrs)
    for n, want in enumerate(case["updates"]):
        assert fn(torch.tensor(float(n))).tolist() == pytest.approx(want["lr"], rel=1e-6, abs=1e-12), n
        assert want["beta1"] == [betas[0]] * len(lrs)  # these schedules leave the momentum alone
