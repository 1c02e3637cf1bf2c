"""A variant's result row: the plain dict that results.json keeps, filled from rank 0's training summary.

Derived numbers (tokens/s, TFLOP/s) come from metrics.py; the step time is the steady one when the
scenario left the first steps out of the timing. `add_floor_ratio` adds the "vs floor" column's value.
"""

from __future__ import annotations

from statistics import mean
from typing import Any

from . import metrics


def base_row(name: str, label: str, engine: str, stage: int | None, status: str, note: str = "") -> dict[str, Any]:
    return {"variant": name, "method": label, "engine": engine, "stage": stage, "status": status, "note": note}


def measured_row(
    row: dict[str, Any],
    res: dict[str, Any],
    *,
    seq_len: int,
    searched: bool,
    est_gpu_gib: float | None,
    search_step: int = 1,
) -> dict[str, Any]:
    """Fill a row from rank 0's summary of a finished training launch."""
    epochs = res["epochs"]
    train_s = mean(e["train_s"] for e in epochs)
    first = epochs[0]
    steady = "steady_s" in first  # the scenario left the first steps out of the timing
    step_s = (
        first["steady_s"] / first["steady_steps"]
        if steady
        else train_s * res["grad_accum"] / res["micro_steps_per_epoch"]
    )
    if res.get("dynamic_padding"):  # tokens counted batch by batch (the width varies)
        tps = (
            metrics.tokens_per_s(first["steady_tokens"], first["steady_s"])
            if steady
            else metrics.tokens_per_s(sum(e["tokens"] for e in epochs), sum(e["train_s"] for e in epochs))
        )
    elif steady:
        tps = metrics.tokens_per_s(res["tokens_per_epoch"] * res["grad_accum"] // res["micro_steps_per_epoch"], step_s)
    else:
        tps = metrics.tokens_per_s(res["tokens_per_epoch"], train_s)
    row.update(
        batch=res["batch"],
        eval_batch=res.get("eval_batch"),
        batch_searched=searched,
        batch_search_step=search_step if searched else None,
        world_size=res["world_size"],
        device=res["device_name"],
        train_s_per_epoch=train_s,
        eval_s_per_epoch=mean(e["eval_s"] for e in epochs),
        eval={k: v for k, v in epochs[-1]["eval"].items()},
        eval_per_epoch=[e["eval"] for e in epochs],
        tokens_per_s=tps,
        step_ms=step_s * 1e3,
        steady=("steady_s" in epochs[0]),
        grad_accum=res["grad_accum"],
        tflops_per_gpu=metrics.tflops_per_gpu(
            tps, res["world_size"], res["n_params"], res["layers"], res["hidden"], res["tokens_per_row"]
        ),
        peak_gpu_gib=res["peak_gpu_gib"],
        peak_cpu_gib=res["peak_cpu_gib"],
        est_gpu_gib=est_gpu_gib,
        n_params=res["n_params"],
        losses=res["losses"],
        data=res["data"],
        data_real=res["data_real"],
        ds_config=res["ds_config"],
        seq_len=seq_len,
        skipped_steps=res.get("skipped_steps"),
        skipped_by_step=res.get("skipped_by_step"),
        recompute=res.get("recompute", False),
        breakdown=res.get("breakdown") or {},
        compiled=res.get("compiled"),
        compiled_graphs=res.get("compiled_graphs", 0),
        dropout=res.get("dropout", False),
        simulated=res.get("simulated", False),
        wandb_live=res.get("wandb_live"),
        train_wall=res.get("train_wall"),
    )
    if row["recompute"]:
        row["method"] += " + activation checkpointing"  # TFLOP/s still counts model FLOPs (no recompute)
    return row


def add_floor_ratio(rows: list[dict[str, Any]], floor: dict[str, float] | None) -> None:
    """Each measured row's step time over the floor (forward+backward alone + optimizer phase)."""
    if not floor:
        return
    limit = floor["fwd_bwd_ms"] + floor["optimizer_ms"]
    for r in rows:
        same_model = r.get("compiled") == floor.get("compiled")  # compiled blocks run faster
        if (
            r["status"] == "ok"
            and r.get("step_ms")
            and r.get("grad_accum") == 1
            and r["batch"] == floor["batch"]
            and same_model
        ):
            r["vs_floor"] = r["step_ms"] / limit
