"""PNG plots of a run: throughput and peak memory per variant, and the training-loss curves.

Every title names the scenario, the device and the precision. Bars carry their values. Memory says what
was measured: peak GPU memory per rank where a GPU ran, peak CPU RSS (resident host memory of a rank
process) beside it or alone on a CPU run. Loss curves that lie on top of each other stay visible (each
variant its own colour, dash pattern and marker), and a lower panel plots each curve minus the ddp curve.
"""

from __future__ import annotations

import math
from typing import Any

from .run_folder import run_path

STYLES = ["-", "--", "-.", ":", (0, (5, 1, 1, 1)), (0, (3, 1, 1, 1, 1, 1)), (0, (1, 2))]
MARKERS = ["o", "s", "^", "v", "D", "x", "+", "*"]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _measured(v: Any) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def _subtitle(summary: dict[str, Any]) -> str:
    ranks = (
        f"rank 0 of {summary['world_size']} simulated"
        if summary.get("simulated")
        else f"{summary['world_size']} rank(s)"
    )
    return f"{summary['scenario']} · {summary['device']} · {summary['precision']} · {ranks}"


def _bar(
    plt: Any, names: list[str], series: dict[str, list[float]], ylabel: str, title: str, path: str, fmt: str
) -> None:
    fig, ax = plt.subplots(figsize=(max(5.5, 1.3 * len(names) + 2), 4.0))
    width = 0.8 / max(1, len(series))
    for k, (label, values) in enumerate(series.items()):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(names))]
        heights = [v if _measured(v) else 0.0 for v in values]
        bars = ax.bar(xs, heights, width, label=label)
        ax.bar_label(bars, labels=[format(v, fmt) if _measured(v) else "–" for v in values], fontsize=8, padding=2)
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.margins(y=0.15)  # room for the value labels
    if len(series) > 1:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plottable(values: list[Any]) -> list[float]:
    """Losses as the axes can scale them: a missing, non-finite or diverged (beyond 1e30) value is a gap."""
    return [v if v is not None and math.isfinite(v) and abs(v) < 1e30 else math.nan for v in values]


def _loss(plt: Any, ok: list[dict[str, Any]], title: str, path: str) -> None:
    ref = next((r for r in ok if r["engine"] == "ddp"), None)
    panels = 2 if ref is not None and len(ok) > 1 else 1
    fig, axes = plt.subplots(
        panels,
        1,
        figsize=(7.0, 3.2 + 2.0 * (panels - 1)),
        sharex=True,
        squeeze=False,
        gridspec_kw={"height_ratios": [3, 2][:panels]},
    )
    top = axes[0][0]
    for k, r in enumerate(ok):
        losses = r["losses"]
        style = dict(
            linestyle=STYLES[k % len(STYLES)],
            marker=MARKERS[k % len(MARKERS)],
            markevery=max(1, len(losses) // 8),
            linewidth=1.3,
            markersize=4,
            color=f"C{k % 10}",
        )
        top.plot(range(1, len(losses) + 1), _plottable(losses), label=r["variant"], **style)
        if panels == 2 and r is not ref:
            n = min(len(losses), len(ref["losses"]))
            diff = [a - b for a, b in zip(losses[:n], ref["losses"][:n]) if a is not None and b is not None]
            axes[1][0].plot(range(1, len(diff) + 1), _plottable(diff), label=r["variant"], **style)
    top.set_ylabel("training loss\n(mean over ranks)")
    top.set_title(title, fontsize=10)
    top.legend(fontsize=8)
    if panels == 2:
        low = axes[1][0]
        low.axhline(0.0, color="0.5", linewidth=0.8)
        low.set_ylabel(f"loss − {ref['variant']}")
        low.legend(fontsize=8)
    axes[-1][0].set_xlabel("micro-step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_plots(run_dir: str, summary: dict[str, Any]) -> list[str]:
    """throughput.png, memory.png and loss.png in `run_dir`; returns their paths."""
    plt = _pyplot()
    ok = [r for r in summary["variants"] if r["status"] == "ok"]
    if not ok:
        return []
    names = [r["variant"] for r in ok]
    where = _subtitle(summary)
    paths = [run_path(run_dir, n) for n in ("throughput.png", "memory.png", "loss.png")]
    _bar(
        plt,
        names,
        {"tokens/s": [r["tokens_per_s"] for r in ok]},
        "tokens/s (all ranks)",
        f"Throughput\n{where}",
        paths[0],
        ",.0f",
    )
    memory = {"peak CPU RSS per rank process": [r["peak_cpu_gib"] for r in ok]}
    gpu = any(_measured(r["peak_gpu_gib"]) for r in ok)
    if gpu:
        memory = {"peak GPU memory per rank": [r["peak_gpu_gib"] for r in ok], **memory}
    what = "GPU memory and host RSS" if gpu else "host memory (CPU RSS; no GPU in this run)"
    _bar(plt, names, memory, "GiB (max over ranks)", f"Peak {what}\n{where}", paths[1], ".2f")
    _loss(plt, ok, f"Training loss\n{where}", paths[2])
    return paths
