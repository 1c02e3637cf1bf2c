"""Weights & Biases: one run per variant, grouped by scenario, plus a summary run with the table.

Offline by default: the runs are written under `<run folder>/wandb/` and uploaded later with
`wandb sync <run folder>/wandb/offline-run-*` (no account or network needed to run a scenario).
A variant that trains is logged live by its rank 0 (zbench/live_log.py, from `wandb_spec`); after the
run this module adds the summary run with the table, and a run from the results for each row that was
not logged live (rows that did not train, rows kept by --resume, every row for `zbench report --wandb`).
A W&B problem never fails a run: it becomes a warning.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from .results import table_rows
from .run_folder import run_path

PROJECT = "zbench"


def _settings(wandb: Any) -> Any:
    return wandb.Settings(console="off", silent=True, x_disable_stats=True)


def wandb_spec(run_dir: str, plan: Any, variant: str, mode: str, ds: dict[str, Any]) -> dict[str, Any]:
    """What rank 0 of a training launch needs to open the variant's live run (plain data: it crosses processes)."""
    run_path(run_dir, "wandb")  # W&B writes below run_dir/wandb: never through a link planted there
    stamp = os.path.basename(os.path.normpath(run_dir))
    config = {
        "scenario": plan.scenario.model_dump(mode="json"),
        "variant": variant,
        "ds_config": ds,
        "run_dir": run_dir,
    }
    return {
        "mode": mode,
        "dir": run_dir,
        "project": os.environ.get("WANDB_PROJECT", PROJECT),
        "group": str(plan.scenario.name),
        "name": f"{variant}@{stamp}",
        "config": config,
    }


def log_runs(run_dir: str, summary: dict[str, Any], mode: str, replay: bool = False) -> list[str]:
    """Write the W&B runs not logged live (all with `replay`); returns their local folders ([] when mode is
    "off" or W&B is missing)."""
    if mode == "off":
        return []
    try:
        import wandb
    except ImportError:
        print("warning: wandb is not installed; skipping W&B logging (pip install wandb)", file=sys.stderr)
        return []
    run_path(run_dir, "wandb")  # W&B writes below run_dir/wandb: never through a link planted there
    stamp = os.path.basename(os.path.normpath(run_dir))
    common = dict(
        project=os.environ.get("WANDB_PROJECT", PROJECT),
        group=summary["scenario"],
        dir=run_dir,
        mode=mode,
        reinit="create_new",
        settings=_settings(wandb),
    )
    folders = []
    try:
        for row in summary["variants"]:
            if row.get("wandb_live") and not replay:
                continue  # its rank 0 logged it while it trained
            config = {
                "scenario": summary.get("scenario_config"),
                "variant": row["variant"],
                "engine": row["engine"],
                "stage": row["stage"],
                "status": row["status"],
                "batch": row.get("batch"),
                "ds_config": row.get("ds_config"),
                "run_dir": run_dir,
            }
            run = wandb.init(name=f"{row['variant']}@{stamp}", job_type="variant", config=config, **common)
            losses, evals = row.get("losses") or [], row.get("eval_per_epoch") or []
            per_epoch = max(1, len(losses) // max(1, len(evals)))
            for step, loss in enumerate(losses):  # steps must increase: eval goes with its epoch's last step
                point: dict[str, Any] = {"train/loss": loss}
                e, last = divmod(step + 1, per_epoch)
                if last == 0 and 0 < e <= len(evals):
                    point.update({"epoch": e, **{f"eval/{k}": v for k, v in evals[e - 1].items()}})
                run.log(point, step=step)
            run.summary.update(
                {
                    k: row.get(k)
                    for k in (
                        "status",
                        "note",
                        "batch",
                        "train_s_per_epoch",
                        "eval_s_per_epoch",
                        "tokens_per_s",
                        "tflops_per_gpu",
                        "peak_gpu_gib",
                        "peak_cpu_gib",
                        "parity",
                        "parity_note",
                    )
                }
            )
            folders.append(run.dir)
            run.finish()
        header, cells = table_rows(summary)
        run = wandb.init(
            name=f"summary@{stamp}", job_type="summary", config={"scenario": summary.get("scenario_config")}, **common
        )
        run.log({"results": wandb.Table(columns=header, data=cells)})
        folders.append(run.dir)
        run.finish()
    except Exception as e:  # W&B must never cost the user a finished benchmark
        print(f"warning: W&B logging failed ({type(e).__name__}: {e}); the results files are complete", file=sys.stderr)
    return [os.path.dirname(f) for f in folders]
