"""Every bad-input error line says how to fix the problem, not only what it is: `Error: <problem>; <fix>`.

The battery (test_bad_input_battery.py) checks this for each of its cases; these are inputs it does not
have: values pydantic itself refuses, the model validators' messages, the launch flags, and the name
`zbench estimate` gives to its --model.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import QUICKSTART, cli, one_line_error, quickstart, scenario_yaml


def fix_part(line: str) -> str:
    """The `<fix>` of `Error: <problem>; <fix>`: what follows the problem's `; ` (empty when there is none)."""
    _, _, fix = line.partition("; ")
    return fix.strip()


SCENARIOS = {
    "precision fp8": (quickstart(precision="fp8"), "precision: Input should be 'fp32', 'bf16' or 'fp16' (got 'fp8')"),
    "compile word": (quickstart(compile="fast"), "compile is true, false or a backend"),
    "no length": (quickstart(epochs=None), "sets neither 'epochs' nor 'steps'"),
    "batch half": (quickstart(batch_size=8.5), "batch_size must be a whole number from 1 to 65,536, got 8.5"),
    "lr word": (quickstart(lr="fast"), "lr must be a finite number (x > 0), got 'fast'"),
    "overrides list": (quickstart(model={"arch": quickstart()["model"]["arch"], "overrides": {"n_head": 2.5}}),
                       "model.overrides.n_head must be a whole number"),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario_errors_name_the_fix(tmp_path: Path, name: str) -> None:
    data, problem = SCENARIOS[name]
    (tmp_path / "sc.yaml").write_text(scenario_yaml(data), encoding="utf-8")
    line = one_line_error(cli("run", tmp_path / "sc.yaml", "--out", tmp_path / "runs", "--wandb", "off"))
    assert problem in line and fix_part(line), line


def test_config_errors_name_the_fix(tmp_path: Path) -> None:
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "stage.json").write_text('{"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 9}}')
    for config, problem in [("list.json", "config must be an object"), ("stage.json", "stage must be an integer 0-3")]:
        line = one_line_error(cli("train", "--config", tmp_path / config))
        assert problem in line and fix_part(line), line


@pytest.mark.parametrize(
    "args,problem",
    [
        (["run", str(QUICKSTART), "--nnodes", "2"], "--nnodes > 1 needs --rdzv-endpoint"),
        (["run", str(QUICKSTART), "--nnodes", "2", "--node-rank", "5", "--rdzv-endpoint", "h:5"], "--node-rank 5"),
        (["run", str(QUICKSTART), "--rdzv-endpoint", "node0:99999"], "must be HOST:PORT"),
    ],
)
def test_launch_flag_errors_name_the_fix(tmp_path: Path, args: list[str], problem: str) -> None:
    line = one_line_error(cli(*args, "--out", tmp_path / "runs", "--wandb", "off"))
    assert problem in line and fix_part(line), line


def test_estimate_names_the_flag_the_user_typed() -> None:
    line = one_line_error(cli("estimate", "--model", "nosuch"))
    assert "--model 'nosuch': no model config file" in line and "model.arch" not in line, line
    assert fix_part(line).startswith("use a shipped name"), line
