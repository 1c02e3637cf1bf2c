"""Results: one row per variant, the run's JSON, CSV and markdown, and the table in the articles' layout.

Rows are plain dicts (result_rows.py fills them; results.json keeps them whole, loss curves included); the
table and the CSV are derived from them here, so `zbench report` rebuilds every file from results.json alone.
"""

from __future__ import annotations

import json
import math
from typing import Any

from .printable import markdown_cell, printable
from .result_rows import add_floor_ratio, base_row, measured_row  # noqa: F401  (re-exported for the runner)
from .run_folder import run_path, write_atomic

METRIC_NAMES = {"f1": "F1", "accuracy": "Accuracy", "loss": "Eval loss", "perplexity": "Perplexity", "bleu": "BLEU"}
TASK_COLUMNS = {
    "classification": ("f1", "accuracy", "loss"),
    "lm": ("loss", "perplexity"),
    "seq2seq": ("bleu", "loss"),  # BLEU only on real text pairs (see task_columns)
    "token_classification": ("accuracy", "loss"),
}
SEQ2SEQ_NOTES = {
    "real": "BLEU: sacrebleu corpus BLEU of greedy outputs (up to target_len tokens) on the eval rows, "
    "generation included in the eval time",
    "synthetic": "no BLEU: it needs real text pairs (data.text_pairs), synthetic tokens report the eval loss only",
}


def task_columns(summary: dict[str, Any]) -> tuple[str, ...]:
    """The metric columns of the table: the task's, less BLEU on synthetic data (it would measure nothing)."""
    cols = TASK_COLUMNS[summary["task"]]
    return cols if summary["data_kind"] == "real" else tuple(c for c in cols if c != "bleu")


def _num(x: Any, fmt: str) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return format(x, fmt)


def skipped_note(r: dict[str, Any]) -> str:
    """The steps the loss scaler skipped (engines that count them: zero_core, DeepSpeed). A skipped step runs no
    update, so where most steps were skipped the step time and tokens/s are not a training speed."""
    skipped, steps = r.get("skipped_steps"), len(r.get("skipped_by_step") or [])
    if not skipped:
        return ""
    if 2 * skipped > steps > 0:
        return (f"{skipped} of {steps} steps skipped (non-finite gradients): no update ran in them, so the step time "
                "is not a training speed")
    return f"{skipped} step(s) skipped (non-finite gradients)"


def table_rows(summary: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and cells of the printed table."""
    cols = task_columns(summary)
    floor = bool(summary.get("floor"))
    # a column of its own when any variant ran compiled, so eager and compiled rows are never mistaken
    compiled = any(r.get("compiled") for r in summary["variants"])
    evals = any(r.get("eval_batch_searched") for r in summary["variants"])  # the articles' "Eval Size Max"
    header = [
        "Variant",
        "Method",
        *(["torch.compile"] if compiled else []),
        "Model",
        "Data",
        "Batch size (max)",
        *(["Eval size (max)"] if evals else []),
        "Train time per epoch (s)",
        "Eval time per epoch (s)",
        *(METRIC_NAMES[c] for c in cols),
        "Tokens/s",
        "Step (ms)",
        *(["Step vs floor"] if floor else []),
        "TFLOP/s per GPU",
        "Peak GPU GiB",
        "Peak CPU GiB",
        "Loss parity vs DDP",
        "Notes",
    ]
    out = []
    for r in summary["variants"]:
        model = f"{summary['init']} {summary['model']}"
        data = summary["data_kind"]
        if r["status"] != "ok":
            note = r["note"] or ("OOM Error" if r["status"] == "oom" else r["status"])
            out.append(
                [
                    r["variant"],
                    r["method"],
                    *(["–"] if compiled else []),
                    model,
                    data,
                    "–",
                    *(["–"] if evals else []),
                    "–",
                    "–",
                    *("–" for _ in cols),
                    *("–" for _ in range(6 + floor)),
                    note,
                ]
            )
            continue
        step = r.get("batch_search_step") or 1
        batch = f"{r['batch']}" + ((f" (step {step})" if step > 1 else "") if r.get("batch_searched") else " (set)")
        parity = r.get("parity")
        parity_cell = (
            r.get("parity_note", "–")
            if parity is None or r.get("parity_note") == "reference"
            else f"{parity:.1e} {r['parity_note']}"
        )
        notes = r.get("note", "")
        if r.get("train_oom_batch"):
            notes = "; ".join(filter(None, [notes, f"batch {r['train_oom_batch']} fit the search's short probe "
                                                   "but ran out of memory over the epoch"]))
        notes = "; ".join(filter(None, [notes, skipped_note(r)]))
        out.append(
            [
                r["variant"],
                r["method"],
                *([r.get("compiled") or "no"] if compiled else []),
                model,
                data,
                batch,
                *([f"{r.get('eval_batch')}" + ("" if r.get("eval_batch_searched") else " (set)")] if evals else []),
                _num(r["train_s_per_epoch"], ".2f"),
                _num(r["eval_s_per_epoch"], ".2f"),
                *(_num(r["eval"].get(c), ".2f" if c in ("perplexity", "bleu") else ".3f") for c in cols),
                _num(r["tokens_per_s"], ",.0f"),
                _num(r.get("step_ms"), ".1f"),
                *([_num(r.get("vs_floor"), ".3f") + ("x" if r.get("vs_floor") else "")] if floor else []),
                _num(r["tflops_per_gpu"], ".3g"),
                _num(r["peak_gpu_gib"], ".2f"),
                _num(r["peak_cpu_gib"], ".2f"),
                parity_cell,
                notes,
            ]
        )
    return header, [[printable(c) for c in cells] for cells in out]  # text from results.json, escaped


def _where(summary: dict[str, Any]) -> str:
    if summary.get("simulated"):
        return (
            f"rank 0 of {summary['world_size']} simulated on one {summary['device']} (memory per rank as "
            f"{summary['world_size']} ranks; nothing communicated: times are lower bounds)"
        )
    return f"{summary['world_size']} rank(s) on {summary['device']}"


def caption(summary: dict[str, Any]) -> str:
    """The line under the table: model, data, precision, where it ran, tolerance and how it was timed (escaped:
    model, data and device are text from results.json)."""
    text = (
        f"{summary['scenario']}: {summary['init']} {summary['model']}, {summary['data_kind']} data "
        f"({summary.get('data_desc') or 'n/a'}), {summary['precision']}, "
        + _where(summary)
        + f"; loss parity tolerance {summary['parity_tol']:g}"
    )
    if summary["task"] == "seq2seq":
        text += "; " + SEQ2SEQ_NOTES[summary["data_kind"]]
    fl = summary.get("floor")
    if fl:
        how = f" (blocks compiled, {fl['compiled']})" if fl.get("compiled") else ""
        text += (
            f"; floor: forward+backward alone{how} {fl['fwd_bwd_ms']:.1f} ms on one device with "
            f"{summary['precision']} weights + optimizer phase {fl['optimizer_ms']:.1f} ms "
            f"for a {fl['shard_numel'] / 1e6:.1f} M-element shard"
        )
    skip = (summary.get("scenario_config") or {}).get("timing_skip_steps")
    if skip:
        text += f"; tokens/s, step time and TFLOP/s leave out the first {skip} optimizer steps"
    elif any(r.get("compiled") for r in summary["variants"]):  # a cold compile takes tens of seconds
        text += "; the compiled rows' tokens/s and step time include compiling (timing_skip_steps leaves it out)"
    return printable(text)


def footer(summary: dict[str, Any]) -> str:
    """The step-time breakdown of the offload rows ("" without any)."""
    split = [
        (r["variant"], r["breakdown"]) for r in summary["variants"] if r.get("status") == "ok" and r.get("breakdown")
    ]
    if not split:
        return ""
    from zero_core.step_timer import format_breakdown

    text = "Step-time breakdown (rank 0, ms per optimizer step, the timed steps):\n"
    return text + "".join(f"- {name}: {format_breakdown(b)}\n" for name, b in split)


def markdown(summary: dict[str, Any]) -> str:
    """The table as a markdown pipe table (the articles' layout), with a caption line."""
    header, rows = table_rows(summary)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(markdown_cell(c) for c in cells) + " |" for cells in rows]
    text = "\n".join(lines) + "\n\n" + caption(summary) + "\n"
    rest = footer(summary)
    return text + ("\n" + rest if rest else "")


def frame(summary: dict[str, Any]) -> Any:
    """One flat CSV row per variant (numbers unformatted; loss curves and configs left to the JSON)."""
    import pandas as pd

    flat = []
    for r in summary["variants"]:
        row = {k: v for k, v in r.items() if k not in ("losses", "eval", "eval_per_epoch", "ds_config")}
        row.update({f"eval_{k}": v for k, v in (r.get("eval") or {}).items()})
        row.update(init=summary["init"], model=summary["model"], data_kind=summary["data_kind"])
        flat.append(row)
    return pd.DataFrame(flat)


def _json_safe(x: Any) -> Any:
    """NaN/inf become null: results.json stays strict JSON for non-Python readers."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def write_files(run_dir: str, summary: dict[str, Any]) -> None:
    """results.json, results.csv and table.md in `run_dir`, each replaced whole (an interrupt leaves the old one);
    all three are made before the first is written."""
    texts = {"results.json": json.dumps(_json_safe(summary), indent=1, default=str),
             "results.csv": frame(summary).to_csv(index=False), "table.md": markdown(summary)}
    for name, text in texts.items():
        write_atomic(run_path(run_dir, name), text)


def write_outputs(run_dir: str, summary: dict[str, Any], wandb_mode: str = "off", replay: bool = False) -> None:
    """Files, plots and (unless off) W&B: the summary run, and a run for each row not logged live while it trained
    (every row with `replay`, as `zbench report --wandb` asks)."""
    from .plots import write_plots
    from .wandb_log import log_runs

    write_files(run_dir, summary)
    write_plots(run_dir, summary)
    log_runs(run_dir, summary, wandb_mode, replay=replay)
