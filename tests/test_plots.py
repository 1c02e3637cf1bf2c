"""The plots say where they ran, label their bars, name CPU RSS as such, and keep equal loss curves visible."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

from zbench import plots  # noqa: E402


def _summary(device: str, gpu: float | None) -> dict:
    def row(name, engine, offset):
        return {
            "variant": name,
            "engine": engine,
            "status": "ok",
            "tokens_per_s": 1234.5 + offset,
            "peak_gpu_gib": gpu,
            "peak_cpu_gib": 1.5,
            "losses": [4.0 + offset, 3.0 + offset, 2.0 + offset],
        }

    return {
        "scenario": "demo",
        "device": device,
        "precision": "bf16",
        "world_size": 2,
        "variants": [
            row("ddp", "ddp", 0.0),
            row("zero2", "zero", 0.0),
            row("zero3", "zero", 0.01),
            {"variant": "oom", "engine": "zero", "status": "oom"},
        ],
    }


@pytest.fixture
def figures(monkeypatch):
    """Every figure write_plots makes, by file name, kept open for inspection."""
    made = {}
    plt = plots._pyplot()
    monkeypatch.setattr(plt, "close", lambda fig: None)
    real = plt.Figure.savefig

    def save(fig, path, *args, **kwargs):
        made[str(path).rsplit("/", 1)[-1]] = fig
        return real(fig, path, *args, **kwargs)

    monkeypatch.setattr(plt.Figure, "savefig", save)
    yield made


def _labels(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def test_cpu_run_plots(tmp_path, figures):
    paths = plots.write_plots(str(tmp_path), _summary("cpu", float("nan")))
    assert [p.rsplit("/", 1)[-1] for p in paths] == ["throughput.png", "memory.png", "loss.png"]
    for fig in figures.values():
        assert "demo · cpu · bf16 · 2 rank(s)" in fig.axes[0].get_title()
    assert _labels(figures["throughput.png"]) == ["1,234", "1,234", "1,235"]  # values on the bars
    memory = figures["memory.png"].axes[0]
    assert "CPU RSS" in memory.get_title() and "GPU" not in memory.get_ylabel()
    assert _labels(figures["memory.png"]) == ["1.50"] * 3
    top, diff = figures["loss.png"].axes
    styles = [line.get_linestyle() for line in top.get_lines()]
    assert len(styles) == 3 and len(set(styles)) == 3  # ddp and zero2 coincide, yet both show
    assert diff.get_ylabel() == "loss − ddp"
    curves = {
        line.get_label(): list(line.get_ydata()) for line in diff.get_lines() if not line.get_label().startswith("_")
    }
    assert curves["zero2"] == [0.0, 0.0, 0.0] and curves["zero3"] == pytest.approx([0.01] * 3)


def test_gpu_run_names_both_memories(tmp_path, figures):
    plots.write_plots(str(tmp_path), _summary("NVIDIA H100", 12.25))
    memory = figures["memory.png"].axes[0]
    legend = [t.get_text() for t in memory.get_legend().get_texts()]
    assert legend == ["peak GPU memory per rank", "peak CPU RSS per rank process"]
    assert _labels(figures["memory.png"])[:3] == ["12.25"] * 3
