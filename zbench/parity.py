"""Loss parity: each measured row's per-step training loss against the ddp row's, like with like only.

A difference of losses means something only when both rows trained the same recipe: the same batch, the
same lr at every step, the same AdamW hyper-parameters, clipping and accumulation, and under fp16 the same
loss-scale policy (the ddp reference scales as the dict's `fp16` keys say, with zero_core's DeepSpeed-exact
scaler). A row that differs gets a cell saying why it is not compared instead of a number that would read
as a pass or a failure. Rows that skipped other fp16 steps than the reference (16-bit gradients overflow
where fp32 ones do not) are compared up to the first step where the skips differ, and the cell says so.
"""

from __future__ import annotations

from typing import Any

from . import metrics

_FP16_KEYS = ("loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis", "consecutive_hysteresis",
              "min_loss_scale")


def _recipe(ds: dict[str, Any], steps: int, world_size: int) -> dict[str, Any] | None:
    """What shapes the numbers of a run, read as zero_core reads the dict; None when it cannot be read."""
    import torch

    from zero_core import load_config
    from zero_core.lr_schedules import DEVICE_SCHEDULES, make_lr_schedule

    try:
        cfg = load_config(ds, world_size)
    except ValueError:
        return None
    p = cfg.optimizer.params
    sched = cfg.scheduler
    if sched is not None and sched.type not in DEVICE_SCHEDULES:
        lrs: Any = sched.model_dump()  # a host schedule: compared as written
    else:
        lr_at = make_lr_schedule(cfg)
        lrs = [round(float(lr_at(torch.tensor(float(i)))[0]), 12) for i in range(max(1, steps))]
    fp16 = cfg.fp16
    return {
        "schedule": {"lr": lrs, "betas": list(p.betas), "eps": p.eps, "weight_decay": p.weight_decay,
                     "decoupled": cfg.optimizer.decoupled, "clipping": float(cfg.gradient_clipping or 0.0),
                     "grad_accum": cfg.gradient_accumulation_steps},
        "loss scale": {k: getattr(fp16, k) for k in _FP16_KEYS} if fp16.enabled else None,
    }


def _why_not(row: dict[str, Any], ref: dict[str, Any]) -> str | None:
    """Why `row` cannot be compared with the reference `ref`, or None when it can."""
    if row.get("simulated"):  # one rank's gradients, other ranks' shards never updated: not the run's numbers
        return "simulated ranks: not compared"
    if row["batch"] != ref["batch"]:
        return f"batch {row['batch']} vs ddp {ref['batch']}"
    if row.get("dropout") and row.get("compiled") != ref.get("compiled"):
        return "dropout masks differ (compiled vs eager)"  # compiled code draws masks from its own generator
    if row.get("ds_config") is None or ref.get("ds_config") is None:
        return None  # rows of an older results.json: nothing to compare the recipe with
    steps = len(ref.get("losses") or []) // max(1, ref.get("grad_accum") or 1)
    mine = _recipe(row["ds_config"], steps, row.get("world_size") or 1)
    theirs = _recipe(ref["ds_config"], steps, ref.get("world_size") or 1)
    if mine is None or theirs is None:
        return "config unreadable: not compared"
    for part in ("schedule", "loss scale"):
        if mine[part] != theirs[part]:
            return f"different {part}: not compared"
    return None


def add_parity(rows: list[dict[str, Any]], tol: float) -> None:
    """Loss parity of every measured row against the first measured ddp row; sets `parity` and `parity_note`."""
    ref = next((r for r in rows if r["engine"] == "ddp" and r["status"] == "ok"), None)
    for r in rows:
        if r["status"] != "ok":
            continue
        why = "no ddp row" if ref is None else (None if r is ref else _why_not(r, ref))
        if r is ref and not r.get("simulated"):
            r["parity"], r["parity_note"] = 0.0, "reference"
        elif r is ref or why is not None:
            r["parity"], r["parity_note"] = None, why or "simulated ranks: not compared"
        else:
            steps = _alike_steps(r, ref)
            micro = None if steps is None else steps * max(1, r.get("grad_accum") or 1)
            r["parity"] = metrics.loss_parity(r["losses"][:micro], ref["losses"][:micro])
            r["parity_note"] = "ok" if r["parity"] <= tol else "FAIL"
            if steps is not None:
                r["parity_note"] += f" over steps 1-{steps} (then skips differ)"


def _alike_steps(row: dict[str, Any], ref: dict[str, Any]) -> int | None:
    """How many optimizer steps are alike when the two rows skipped different ones (None: the same ones, or
    unknown). A row that skips an update the other applies trains other weights from
    then on, so only the losses up to that step, computed before its update, are compared. fp16 gradients
    can overflow where the reference's fp32 gradients do not, so the same loss-scale policy does not
    guarantee the same skips."""
    mine, theirs = row.get("skipped_by_step"), ref.get("skipped_by_step")
    if not mine or not theirs:
        return None
    first = next((k for k, (a, b) in enumerate(zip(mine, theirs)) if a != b), None)
    return None if first is None else first + 1
