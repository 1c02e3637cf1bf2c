"""`engine.monitor`: DeepSpeed's MonitorMaster, `write_events([(tag, value, step), ...])` on rank 0.

The config's "csv_monitor" section writes DeepSpeed's layout: one `<output_path>/<job_name>/<tag>.csv` per tag
(its "/" and spaces made "_"), a `step,<last part of the tag>` header the first time this process writes it,
then `step,value` rows appended. "tensorboard" writes scalars with torch's SummaryWriter into
`<output_path>/<job_name>`. "wandb" and "comet" send to services zero_core does not talk to: their events are
dropped, and said so once.

The engine's own events, as DeepSpeed's engine writes them after every accumulation boundary's step (not only at
steps_per_print), x-axis the samples trained so far: `Train/Samples/lr` (the first group's lr for the next
update) and, under fp16, `Train/Samples/loss_scale` (`write_update_events`); with `wall_clock_breakdown` on, also
the window's phase times, `Train/Samples/elapsed_time_ms_forward`, `_backward`,
`_backward_inner`, `_backward_allreduce` and `_step` (`write_phase_events`).
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

_JOB = "DeepSpeedJobName"  # DeepSpeed's default job_name
_DROPPED = ("wandb", "comet")


@dataclass(frozen=True)
class WriterSection:
    """A csv_monitor or tensorboard section, as DeepSpeed reads it."""

    enabled: bool = False
    output_path: str = ""
    job_name: str = _JOB


@dataclass(frozen=True)
class MonitorConfig:
    """DeepSpeed's monitor_config: the sections, and `enabled` when events go anywhere."""

    csv_monitor: WriterSection = WriterSection()
    tensorboard: WriterSection = WriterSection()
    dropped: tuple[str, ...] = field(default=())  # enabled sections whose events zero_core drops

    @property
    def enabled(self) -> bool:
        return self.csv_monitor.enabled or self.tensorboard.enabled


def _flag(name: str, section: dict) -> bool:
    value = section.get("enabled", False)
    if not isinstance(value, bool):
        raise ValueError(f"{name}.enabled must be true or false, got {value!r}; fix the config's {name!r} section")
    return value


def _writer_section(name: str, section: Any) -> WriterSection:
    section = section or {}
    enabled = _flag(name, section)
    texts = {}
    for key, default in (("output_path", ""), ("job_name", _JOB)):
        value = section.get(key, default)
        if not isinstance(value, str) or "\0" in value:
            raise ValueError(f"{name}.{key} must be a path as a string, got {value!r}; fix the config's {name!r} "
                             "section")
        texts[key] = value
    return WriterSection(enabled, texts["output_path"], texts["job_name"])


def read_monitor_config(config: Any) -> MonitorConfig:
    """The monitor sections of the validated config (zero_core carries them as given, unchecked)."""
    dropped = tuple(n for n in _DROPPED if _flag(n, getattr(config, n, None) or {}))
    return MonitorConfig(_writer_section("csv_monitor", getattr(config, "csv_monitor", None)),
                         _writer_section("tensorboard", getattr(config, "tensorboard", None)), dropped)


def check_section(name: str, section: Any) -> None:
    """The ValueError the engine raises for monitor section `name` as given (the config checks call it at load)."""
    if name in _DROPPED:
        _flag(name, section or {})
    else:
        _writer_section(name, section)


def _number(value: Any) -> Any:
    """A one-element tensor as its Python number (what a loss or an lr usually is), anything else as given."""
    return value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value


def _event(event: Any) -> tuple[str, Any, int]:
    if not (isinstance(event, (tuple, list)) and len(event) == 3 and isinstance(event[0], str)):
        raise ValueError(f"monitor.write_events takes (tag, value, step) tuples with a str tag, got {event!r}; "
                         "pass a list of such tuples")
    return event[0], _number(event[1]), int(_number(event[2]))


class CsvWriter:
    def __init__(self, section: WriterSection) -> None:
        self.folder = Path(section.output_path) / section.job_name
        self.folder.mkdir(parents=True, exist_ok=True)
        self.started: set[str] = set()  # files given their header by this process

    def write(self, events: list[tuple[str, Any, int]]) -> None:
        for tag, value, step in events:
            stem = tag.replace("/", "_").replace(" ", "_")  # no "/" left: the file stays in the folder
            with open(self.folder / f"{stem}.csv", "a", newline="") as f:
                rows = csv.writer(f)
                if stem not in self.started:
                    self.started.add(stem)
                    rows.writerow(["step", tag.split("/")[-1]])
                rows.writerow([step, value])


class TensorBoardWriter:
    def __init__(self, section: WriterSection) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ValueError("the config's tensorboard section is enabled but the tensorboard package is missing; "
                             "pip install tensorboard, or set tensorboard.enabled false") from None
        folder = os.path.join(section.output_path, section.job_name)
        os.makedirs(folder, exist_ok=True)
        self.summary = SummaryWriter(log_dir=folder)

    def write(self, events: list[tuple[str, Any, int]]) -> None:
        for tag, value, step in events:
            self.summary.add_scalar(tag, value, step)
        self.summary.flush()


class EngineMonitor:
    """Rank 0 writes every event to each enabled writer; the other ranks accept and drop them, as DeepSpeed's."""

    def __init__(self, config: Any, rank: int) -> None:
        self.config = read_monitor_config(config)
        self.enabled = self.config.enabled
        self.writers: list[Any] = []
        if rank != 0:
            return
        if self.config.csv_monitor.enabled:
            self.writers.append(CsvWriter(self.config.csv_monitor))
        if self.config.tensorboard.enabled:
            self.writers.append(TensorBoardWriter(self.config.tensorboard))
        if self.config.dropped:
            print(f"zero_core: the config's {' and '.join(self.config.dropped)} section(s) are enabled; zero_core "
                  "sends no events there (csv_monitor and tensorboard are written)", flush=True)

    def write_events(self, event_list: Any) -> None:
        events = [_event(e) for e in event_list]  # checked on every rank: a bad call fails everywhere alike
        for writer in self.writers:
            writer.write(events)


def write_update_events(engine: Any) -> None:
    """After a boundary's step: the engine's lr (and fp16 loss scale) events on rank 0. Reading them syncs with the
    device, so nothing is read where no writer takes them (monitor off, or another rank)."""
    monitor = engine.monitor  # made at the first update; a property read after that
    if not monitor.writers:
        return
    samples = engine.global_samples
    events = [("Train/Samples/lr", engine.get_lr()[0], samples)]
    if engine.fp16_enabled():
        events.append(("Train/Samples/loss_scale", float(engine.scaler.scale.item()), samples))
    monitor.write_events(events)


# engine_wall_clock's phases and the names DeepSpeed's engine gives their events, in the order it writes them
PHASE_EVENTS = {"fwd": "forward", "bwd": "backward", "bwd_inner": "backward_inner",
                "bwd_allreduce": "backward_allreduce", "step": "step"}


def write_phase_events(engine: Any, ms: dict[str, float]) -> None:
    """After a boundary's step, with wall_clock_breakdown on: the accumulation window's milliseconds per phase (0.0
    for a phase not timed yet), on rank 0, as DeepSpeed's engine writes them."""
    monitor = engine.monitor
    if not monitor.writers:
        return
    samples = engine.global_samples
    monitor.write_events([(f"Train/Samples/elapsed_time_ms_{tag}", float(ms.get(phase, 0.0)), samples)
                          for phase, tag in PHASE_EVENTS.items()])
