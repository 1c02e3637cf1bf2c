"""PNG plots of a run: throughput and peak memory per variant, and the training-loss curves."""

from __future__ import annotations

import math
from typing import Any

from .run_folder import run_path


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _bar(plt: Any, names: list[str], series: dict[str, list[float]], ylabel: str, title: str, path: str) -> None:
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(names) + 2), 3.6))
    width = 0.8 / max(1, len(series))
    for k, (label, values) in enumerate(series.items()):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(names))]
        ax.bar(xs, [0.0 if v is None or math.isnan(v) else v for v in values], width, label=label)
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if len(series) > 1:
        ax.legend()
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
    title = summary["scenario"]
    paths = [run_path(run_dir, n) for n in ("throughput.png", "memory.png", "loss.png")]
    _bar(plt, names, {"tokens/s": [r["tokens_per_s"] for r in ok]}, "tokens/s", f"{title}: throughput", paths[0])
    memory = {"peak CPU RSS GiB": [r["peak_cpu_gib"] for r in ok]}
    if any(r["peak_gpu_gib"] is not None and not math.isnan(r["peak_gpu_gib"]) for r in ok):
        memory = {"peak GPU GiB": [r["peak_gpu_gib"] for r in ok], **memory}
    _bar(plt, names, memory, "GiB per rank", f"{title}: peak memory", paths[1])
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for r in ok:
        ax.plot(range(1, len(r["losses"]) + 1), r["losses"], label=r["variant"], linewidth=1.2)
    ax.set_xlabel("micro-step")
    ax.set_ylabel("training loss (mean over ranks)")
    ax.set_title(f"{title}: loss curves")
    ax.legend()
    fig.tight_layout()
    fig.savefig(paths[2], dpi=110)
    plt.close(fig)
    return paths
