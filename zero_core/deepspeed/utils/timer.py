"""`deepspeed.utils.timer`: `SynchronizedWallClockTimer` (named timers: `timers("fwd").start()` / `.stop()`,
`.elapsed()` in milliseconds, `timers.log([...])`) and `ThroughputTimer` (samples per second over global steps),
as DeepSpeed 0.19.8's behave, with its units: `Timer.mean()` is the trimmed mean span in milliseconds and
`get_mean()` multiplies that by 1000 again, as DeepSpeed's does.

Wall clock, the device synchronised at each start and stop on CUDA (DeepSpeed records CUDA events there; a
synchronised wall clock measures the same span); on the CPU nothing to synchronise."""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

import torch

from ...engine_timers import EngineTimer
from ..accelerator import get_accelerator
from .logging import logger, print_dist

FORWARD_MICRO_TIMER, FORWARD_GLOBAL_TIMER = "fwd_microstep", "fwd"  # DeepSpeed's names for the engine's phases
BACKWARD_MICRO_TIMER, BACKWARD_GLOBAL_TIMER = "bwd_microstep", "bwd"
BACKWARD_INNER_MICRO_TIMER, BACKWARD_INNER_GLOBAL_TIMER = "bwd_inner_microstep", "bwd_inner"
BACKWARD_REDUCE_MICRO_TIMER, BACKWARD_REDUCE_GLOBAL_TIMER = "bwd_allreduce_microstep", "bwd_allreduce"
STEP_MICRO_TIMER, STEP_GLOBAL_TIMER = "step_microstep", "step"
TIME_EPSILON = 1e-6
GiB = 1024**3


def trim_mean(data: list[float], trim_percent: float) -> float:
    """Mean of `data` without its lowest and highest `trim_percent` (each end rounded to the nearest count)."""
    if not 0.0 <= trim_percent <= 1.0:
        raise ValueError(f"trim_percent must be in [0, 1], got {trim_percent!r}")
    if not data:
        return 0
    ordered = sorted(data)
    cut = round(len(ordered) * trim_percent)
    kept = ordered[cut:len(ordered) - cut]
    return sum(kept) / len(kept) if kept else float("nan")


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


class _Timer(EngineTimer):
    """One named timer: the engine's (start/stop/elapsed/reset), with DeepSpeed's `mean()` in milliseconds."""

    def mean(self) -> float:
        self.elapsed(reset=False)
        return trim_mean([span * 1000.0 for span in self.spans], 0.1)


def _positive(call: str, normalizer: float) -> None:
    if not normalizer > 0:
        raise ValueError(f"timers.{call} normalizer must be > 0, got {normalizer!r}; pass a positive number")


class SynchronizedWallClockTimer:
    """Timers by name, made on first use."""

    Timer = _Timer

    def __init__(self) -> None:
        self.timers: dict[str, _Timer] = {}

    def __call__(self, name: str) -> _Timer:
        if name not in self.timers:
            self.timers[name] = _Timer(name, _device())
        return self.timers[name]

    def get_timers(self) -> dict[str, _Timer]:
        return self.timers

    @staticmethod
    def memory_usage() -> str:
        acc = get_accelerator()
        return (f" | mem_allocated: {acc.memory_allocated() / GiB:.4f} GB"
                f" | max_mem_allocated: {acc.max_memory_allocated() / GiB:.4f} GB"
                f" | cache_allocated: {acc.memory_cached() / GiB:.4f} GB"
                f" | max_cache_allocated: {acc.max_memory_cached() / GiB:.4f} GB")

    def log(self, names: Iterable[str], normalizer: float = 1.0, reset: bool = True, memory_breakdown: bool = False,
            ranks: list[int] | None = None) -> None:
        """Print `time (ms) | name: x.xx | ...` (each known timer's milliseconds / normalizer) on `ranks` (rank 0
        by default). `memory_breakdown` is taken and unused, as in DeepSpeed."""
        _positive("log", normalizer)
        line = "time (ms)" + "".join(f" | {name}: {self.timers[name].elapsed(reset=reset) / normalizer:.2f}"
                                     for name in names if name in self.timers)
        print_dist(line, ranks=ranks or [0])

    def get_mean(self, names: Iterable[str], normalizer: float = 1.0, reset: bool = True) -> dict[str, float]:
        """{name: timer.mean() * 1000 / normalizer} for the known names (DeepSpeed's scale; `reset` unused)."""
        _positive("get_mean", normalizer)
        return {name: self.timers[name].mean() * 1000.0 / normalizer for name in names if name in self.timers}


class NoopTimer:
    """DeepSpeed's stand-in when wall-clock timing is off: every call does nothing; elapsed and mean are 0."""

    class Timer:
        def start(self) -> None: ...
        def stop(self, **kwargs: Any) -> None: ...
        def reset(self) -> None: ...
        def elapsed(self, **kwargs: Any) -> float: return 0
        def mean(self) -> float: return 0

    def __init__(self) -> None:
        self.timer = self.Timer()

    def __call__(self, name: str) -> Timer:
        return self.timer

    def get_timers(self) -> dict:
        return {}

    def log(self, names: Iterable[str], normalizer: float = 1.0, reset: bool = True, memory_breakdown: bool = False,
            ranks: list[int] | None = None) -> None: ...

    def get_mean(self, names: Iterable[str], normalizer: float = 1.0, reset: bool = True) -> None: ...


def _flag(config: Any, name: str) -> bool:
    """The timers config's `enabled` / `synchronized` (both default True, as DeepSpeed's timers section): an object
    with those attributes (DeepSpeed's DeepSpeedThroughputTimerConfig), a dict of them, or None."""
    if config is None:
        return True
    if isinstance(config, dict):
        return bool(config.get(name, True))
    return bool(getattr(config, name))


class ThroughputTimer:
    """Samples per second: `start()` / `stop(global_step=True)` around each step; steps from `start_step` on are
    timed. Every `steps_per_output` global steps `stop` reports the running and current rates through
    `logging_fn` (logger.info by default)."""

    def __init__(self, config: Any, batch_size: int | None, start_step: int = 2, steps_per_output: int | None = None,
                 monitor_memory: bool = False, logging_fn: Callable[[str], Any] | None = None) -> None:
        self.config = config
        self.enabled, self.synchronized = _flag(config, "enabled"), _flag(config, "synchronized")
        self.batch_size = 1 if batch_size is None else batch_size
        self.start_step, self.steps_per_output = start_step, steps_per_output
        self.monitor_memory = monitor_memory
        self.logging = logging_fn if logging_fn is not None else logger.info
        self.start_time = self.end_time = 0.0
        self.started = self.initialized = False
        self.epoch_count = self.micro_step_count = self.global_step_count = 0
        self.total_elapsed_time = self.step_elapsed_time = 0.0

    def update_epoch_count(self) -> None:
        self.epoch_count += 1
        self.micro_step_count = 0

    def _sync(self) -> None:
        if self.synchronized:
            get_accelerator().synchronize()

    def start(self) -> None:
        if not self.enabled:
            return
        self.initialized = self.started = True
        if self.global_step_count >= self.start_step:
            self._sync()
            self.start_time = time.time()

    def stop(self, global_step: bool = False, report_speed: bool = True) -> None:
        if not self.enabled or not self.started:
            return
        self.started = False
        self.micro_step_count += 1
        self.global_step_count += int(bool(global_step))
        if self.start_time <= 0:  # not timing yet (before start_step)
            return
        self._sync()
        self.end_time = time.time()
        span = self.end_time - self.start_time
        self.total_elapsed_time += span
        self.step_elapsed_time += span
        if not global_step:
            return
        if report_speed and self.steps_per_output and self.global_step_count % self.steps_per_output == 0:
            self._report()
        self.step_elapsed_time = 0.0

    def _report(self) -> None:
        acc = get_accelerator()
        where = f"epoch={self.epoch_count}/micro_step={self.micro_step_count}/global_step={self.global_step_count}"
        self.logging(f"{where}, RunningAvgSamplesPerSec={self.avg_samples_per_sec()}, "
                     f"CurrSamplesPerSec={self.batch_size / (self.step_elapsed_time + TIME_EPSILON)}, "
                     f"MemAllocated={round(acc.memory_allocated() / GiB, 2)}GB, "
                     f"MaxMemAllocated={round(acc.max_memory_allocated() / GiB, 2)}GB")
        if self.monitor_memory:
            import psutil  # only for this report, as DeepSpeed's

            self.logging(f"{where}, vm %: {psutil.virtual_memory().percent}, swap %: {psutil.swap_memory().percent}")

    def avg_samples_per_sec(self) -> float:
        """batch_size / mean seconds per timed global step; -inf before any step is timed (DeepSpeed's divides by
        zero at step start_step and gives -inf only before the first global step)."""
        timed_steps = self.global_step_count - self.start_step
        if self.global_step_count <= 0 or timed_steps <= 0 or self.total_elapsed_time <= 0:
            return float("-inf")
        return self.batch_size / (self.total_elapsed_time / timed_steps)
