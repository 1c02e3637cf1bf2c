"""`deepspeed.utils.timer`: SynchronizedWallClockTimer and ThroughputTimer answer as DeepSpeed 0.19.8's on the same
clock readings (DeepSpeed's answers recorded by tests/fixtures/make_deepspeed_small_utils.py on a fake clock; here
the same readings are fed to zero_core's timers, so nothing depends on real time)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

import zero_core.engine_timers
from zero_core.deepspeed.utils import timer
from helpers import fixture_script

FIXTURES = Path(__file__).resolve().parent / "fixtures"
REF = json.loads((FIXTURES / "deepspeed_small_utils.json").read_text())["timers"]
MAKER = fixture_script("make_deepspeed_small_utils")


def _clock(monkeypatch, instants: list[float]) -> None:
    """The timers read these instants in turn (the engine timer's perf_counter, the throughput timer's time)."""
    fake = MAKER.FakeClock(instants)
    monkeypatch.setattr(zero_core.engine_timers, "time", SimpleNamespace(perf_counter=fake))
    monkeypatch.setattr(timer, "time", SimpleNamespace(time=fake))


def test_wall_clock_timer_elapsed_mean_and_get_mean_are_deepspeeds(monkeypatch, capsys):
    timers = timer.SynchronizedWallClockTimer()
    _clock(monkeypatch, MAKER.span_instants(MAKER.TIMER_SPANS))
    for _ in MAKER.TIMER_SPANS:
        timers("a").start()
        timers("a").stop()
    assert timers("a").elapsed(reset=False) == pytest.approx(REF["elapsed_keep"], rel=1e-12)
    assert timers("a").mean() == pytest.approx(REF["mean"], rel=1e-12)  # milliseconds
    means = timers.get_mean(["a", "missing"], normalizer=2.0)  # DeepSpeed's scale: mean() * 1000 / normalizer
    assert means.keys() == REF["get_mean"].keys()
    assert means["a"] == pytest.approx(REF["get_mean"]["a"], rel=1e-12)
    _clock(monkeypatch, MAKER.span_instants(MAKER.MORE_SPANS, 1000.0))
    for _ in MAKER.MORE_SPANS:
        timers("b").start()
        timers("b").stop()
    assert timers("b").mean() == pytest.approx(REF["mean_15"], rel=1e-12)  # 2 trimmed from each end of 15
    assert set(timers.get_timers()) == {"a", "b"}


def test_log_prints_the_normalised_milliseconds_and_resets(monkeypatch, capsys):
    timers = timer.SynchronizedWallClockTimer()
    _clock(monkeypatch, [10.0, 10.5, 20.0, 20.25])
    timers("fwd").start()
    timers("fwd").stop()
    timers("bwd").start()
    timers("bwd").stop()
    timers.log(["fwd", "bwd", "missing"], normalizer=2.0)
    assert "time (ms) | fwd: 250.00 | bwd: 125.00" in capsys.readouterr().out
    assert timers("fwd").elapsed() == 0.0  # log reset them
    with pytest.raises(ValueError, match="normalizer"):
        timers.log(["fwd"], normalizer=0)


def test_throughput_timer_signature_rates_and_reports_are_deepspeeds(monkeypatch):
    assert list(inspect.signature(timer.ThroughputTimer).parameters) == [
        "config", "batch_size", "start_step", "steps_per_output", "monitor_memory", "logging_fn"]
    logs: list[str] = []
    config = SimpleNamespace(enabled=True, synchronized=True)
    tput = timer.ThroughputTimer(config, 8, start_step=2, steps_per_output=2, logging_fn=logs.append)
    _clock(monkeypatch, MAKER.span_instants([0.5, 0.25, 0.5, 0.25, 1.0, 0.5], 100.0)[4:])
    avgs = []
    for _ in range(6):
        tput.start()
        tput.stop(global_step=True)
        avgs.append(tput.avg_samples_per_sec())
    # DeepSpeed divides by zero until a step is timed; zero_core answers -inf there, as DeepSpeed does before any step
    want = [float("-inf") if a == "ZeroDivisionError" else a for a in REF["throughput_avgs"]]
    assert avgs == pytest.approx(want, rel=1e-12)
    assert [line.split(", MemAllocated")[0] for line in logs] == REF["throughput_logs"]
    assert all(line.endswith("GB") for line in logs)


def test_throughput_timer_off_or_not_started_does_nothing(monkeypatch):
    _clock(monkeypatch, [])  # any clock reading fails
    off = timer.ThroughputTimer({"enabled": False}, 4)
    off.start()
    off.stop(global_step=True)
    assert off.global_step_count == 0 and off.avg_samples_per_sec() == float("-inf")
    idle = timer.ThroughputTimer(None, None)  # DeepSpeed's defaults: on, synchronized; batch size 1
    idle.stop(global_step=True)
    assert idle.global_step_count == 0 and idle.batch_size == 1
