"""Live W&B logging from rank 0 while a variant trains: one row per optimizer step, eval and summary at the end.

Keys follow Hugging Face Trainer's W&B names where it has one (`train/loss`, `train/learning_rate`,
`train/grad_norm`, `train/epoch`, `train/global_step`, `eval/loss`, `eval/runtime`), so dashboards compare
across tools; the rest are zbench's (`train/loss_scale`, `train/skipped_steps`, `train/tokens_per_second`,
`train/step_time_s`, `train/gpu_memory_gib` or `train/cpu_rss_gib`). `train/loss` is rank 0's mean over the
step's micro-batches (the table's curve is the mean over ranks, gathered once at the end).

Each step's numbers stay device tensors until a flush, at most once per `every_s` seconds (and after the first
step), reads them all at once: one host sync per flush, not per step, so logging does not change what is
timed. Step time and tokens/s are the wall time since the previous flush over the steps it covers.
Offline by default (`wandb sync` uploads the folder later). Only rank 0 of a training launch imports wandb;
a W&B problem is a warning on stderr and never fails the run.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import torch

from .host_memory import rss_bytes


def _number(x: Any) -> float | None:
    if x is None:
        return None
    return float(x.reshape(-1)[0]) if isinstance(x, torch.Tensor) else float(x)


def _warn(what: str, err: Exception) -> None:
    print(
        f"warning: W&B {what} failed ({type(err).__name__}: {err}); the results files are complete",
        file=sys.stderr,
        flush=True,
    )


class LiveLog:
    """`spec` (from the runner): mode, dir, project, group, name, config; None logs nothing."""

    def __init__(
        self, spec: dict[str, Any] | None, rank: int, world: int, device: torch.device, every_s: float = 1.0
    ) -> None:
        self.run: Any = None
        self.world, self.device, self.every_s = world, device, every_s
        self.pending: list[dict[str, Any]] = []
        self.last_flush = time.perf_counter()
        self.step = 0
        if spec is None or rank != 0:
            return
        try:
            import wandb

            self.run = wandb.init(
                project=spec["project"],
                group=spec["group"],
                name=spec["name"],
                dir=spec["dir"],
                mode=spec["mode"],
                job_type="variant",
                config=spec["config"],
                reinit="create_new",
                settings=wandb.Settings(console="off", silent=True, x_disable_stats=True),
            )
        except Exception as e:  # noqa: BLE001 - no W&B problem may cost the benchmark
            _warn("start", e)
            self.run = None

    @property
    def folder(self) -> str | None:
        return self.run.dir if self.run is not None else None

    def start_timing(self) -> None:
        self.last_flush = time.perf_counter()

    def optimizer_step(
        self, micro_losses: list[torch.Tensor], stats: dict[str, Any], tokens: int, epoch: float
    ) -> None:
        """After each optimizer step: keep its numbers (no host sync); flush when due."""
        if self.run is None:
            return
        self.step += 1
        loss = torch.stack([x.reshape(()) for x in micro_losses]).mean()
        self.pending.append(
            {
                "loss": loss,
                **stats,
                "tokens": tokens * self.world,
                "epoch": epoch,
                "step": self.step,
                "memory": self._memory(),
            }
        )
        if self.step == 1 or time.perf_counter() - self.last_flush >= self.every_s:
            self.flush()

    def _memory(self) -> tuple[str, float]:
        if self.device.type == "cuda":  # what the allocator holds now: no device sync
            return "train/gpu_memory_gib", torch.cuda.memory_allocated(self.device) / 2**30
        return "train/cpu_rss_gib", rss_bytes() / 2**30

    def flush(self) -> None:
        if self.run is None or not self.pending:
            return
        rows = [{k: _number(v) if k not in ("memory", "step") else v for k, v in p.items()} for p in self.pending]
        now = time.perf_counter()  # after the reads above: the device has caught up with these steps
        per_step = (now - self.last_flush) / len(rows)
        self.last_flush, self.pending = now, []
        try:
            for r in rows:
                key, memory = r["memory"]
                point = {
                    "train/global_step": r["step"],
                    "train/loss": r["loss"],
                    "train/epoch": r["epoch"],
                    "train/step_time_s": per_step,
                    "train/tokens_per_second": r["tokens"] / per_step,
                    key: memory,
                }
                for name in ("learning_rate", "grad_norm", "loss_scale", "skipped_steps"):
                    if r.get(name) is not None:
                        point[f"train/{name}"] = r[name]
                self.run.log(point, step=r["step"])
        except Exception as e:  # noqa: BLE001
            _warn("logging", e)
            self.run = None

    def evaluated(self, metrics: dict[str, float], seconds: float) -> None:
        self.flush()
        if self.run is not None:
            # the epoch's last optimizer step (W&B steps only increase)
            self.run.log({"eval/runtime": seconds, **{f"eval/{k}": v for k, v in metrics.items()}}, step=self.step)

    def finish(self, summary: dict[str, Any]) -> None:
        self.flush()
        if self.run is None:
            return
        try:
            self.run.summary.update(summary)
            self.run.finish()
        except Exception as e:  # noqa: BLE001
            _warn("finish", e)
