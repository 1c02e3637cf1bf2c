"""Model names resolve from any folder (the registry ships as package data), a Hugging Face config.json or model
folder is accepted wherever an arch is, `zbench --help` imports no torch, and progress bars show an ETA."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tomllib

import pytest

from helpers import REPO, TINY, repo_pythonpath, tiny_data, write_scenario, zbench
from zbench.models.configs import load_arch
from zbench.models.registry import REGISTRY_DIR, names

HEAVY = ("torch", "zero_core", "checkpoints", "pandas", "matplotlib", "wandb", "pydantic", "transformers")


def _python(code: str, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": repo_pythonpath()}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


def test_help_imports_no_heavy_module(tmp_path):
    code = (
        "import sys, zbench.cli\n"
        "try:\n    zbench.cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
        f"print('LOADED', sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    proc = _python(code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "run " in proc.stdout and "estimate " in proc.stdout and "convert " in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "LOADED []"


def test_the_listed_help_is_each_commands_own():
    import click

    from zbench.cli import LAZY, main

    ctx = click.Context(main)
    for name, (_, _, text) in LAZY.items():
        command = main.get_command(ctx, name)
        assert command.get_short_help_str(60) == click.Command(name, help=text).get_short_help_str(60), name


def test_estimate_resolves_a_name_from_another_folder(tmp_path):
    proc = zbench("estimate", "--model", "gpt2-xl", "--gpus", "2", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("model gpt2-xl") and "| 2 |" in proc.stdout or "stage" in proc.stdout.lower()


def test_a_scenario_elsewhere_names_a_shipped_model(tmp_path):
    from zbench.plan import build_plan

    path = write_scenario(
        tmp_path, tiny_data([{"name": "ddp", "engine": "ddp"}], model={"arch": "tiny-gpt"}), "elsewhere"
    )
    plan = build_plan(path)
    assert plan.arch.name == "tiny-gpt" and plan.arch.config == load_arch(TINY, str(tmp_path)).config
    own = tmp_path / "models"  # a scenario folder's own config of that name comes first
    own.mkdir()
    mine = json.loads(open(TINY).read())
    mine["config"]["n_layer"] = 3
    (own / "tiny-gpt.json").write_text(json.dumps(mine))
    assert build_plan(path).arch.config["n_layer"] == 3


def test_one_registry_for_train_and_scenarios():
    """gpt2-xl has the vocabulary of its Hugging Face config (50257), as the article's --config_name gpt2-xl."""
    from zbench.models.configs import gpt_config
    from zbench.train_demo import preset_config

    assert preset_config("gpt2-xl") == gpt_config(load_arch("gpt2-xl", "."))
    assert preset_config("gpt2-xl").vocab_size == 50257
    assert preset_config("tiny") == gpt_config(load_arch("tiny-gpt", "."))
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "model_configs/*.json" in package_data["zbench"] and len(names()) >= 12
    assert os.path.dirname(REGISTRY_DIR) == os.path.join(str(REPO), "zbench")


@pytest.mark.parametrize("as_folder", [False, True])
def test_a_hugging_face_config_json_or_model_folder_is_an_arch(tmp_path, as_folder):
    folder = tmp_path / "my-gpt2"
    folder.mkdir()
    hf = {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "n_layer": 2,
        "n_head": 2,
        "n_embd": 32,
        "n_positions": 64,
        "vocab_size": 300,
        "transformers_version": "4.40.0",
    }
    (folder / "config.json").write_text(json.dumps(hf))
    arch = load_arch(str(folder) if as_folder else str(folder / "config.json"), str(tmp_path))
    assert (arch.name, arch.family, arch.config) == ("my-gpt2", "hf", hf)
    pytest.importorskip("transformers")
    proc = zbench("estimate", "--model", "my-gpt2", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("model my-gpt2")


def test_progress_bars_show_the_time_remaining():
    from rich.console import Console

    from zbench.progress import make_bars

    clock = iter(float(t) for t in range(100))
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120, color_system=None)
    bars = make_bars(console, get_time=lambda: next(clock))
    task = bars.add_task("ddp train", total=10)
    for done in range(1, 5):
        bars.update(task, completed=done)
    console.print(bars.make_tasks_table(bars.tasks))
    text = out.getvalue()
    assert "ETA" in text and "4/10" in text and "0:00:" in text.split("ETA")[-1]
