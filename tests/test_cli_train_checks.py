"""`zbench train`: what can be known before the ranks start is refused then, in one `Error:` line (monitor sections,
NVMe folders, CPU ranks per core), a rank's own input error also reaches the terminal as one line, and flags left at
their defaults are not held against the config. Scenarios name an Accelerate num_processes they do not use."""

from __future__ import annotations

import copy
import json

import pytest
from click.testing import CliRunner

import zbench.cpu_ranks
import zbench.train_demo
import zero_core.config_checks_monitor
from helpers import one_line_error, tiny_data, write_scenario
from zbench.cli import main
from zero_core import ConfigError, load_config

MB = {"train_micro_batch_size_per_gpu": 2}
SUMMARY = {"stage": 2, "world_size": 1, "steps": 1, "warmup": 0, "first_loss": 1.0, "final_loss": 0.5,
           "tokens_per_s": 1.0, "step_ms": 1.0, "peak_gib": float("nan"), "trainable_params": 1, "breakdown": {}}


@pytest.fixture
def train(tmp_path, monkeypatch):
    """`zbench train [--config <config>] <flags>` with the launch replaced; (result, whether ranks were launched)."""
    launched = []
    monkeypatch.setattr(zbench.train_demo, "launch", lambda job, nproc: launched.append(job) or SUMMARY)

    def run(config: dict | None, *flags: str):
        args = ["train", *flags]
        if config is not None:
            (tmp_path / "ds.json").write_text(json.dumps(config))
            args += ["--config", str(tmp_path / "ds.json")]
        launched.clear()
        return CliRunner().invoke(main, args), bool(launched)

    return run


def test_enabled_tensorboard_without_its_package_is_refused_before_any_rank(train, tmp_path, monkeypatch):
    monkeypatch.setattr(zero_core.config_checks_monitor.importlib.util, "find_spec", lambda name: None)
    board = {"enabled": True, "output_path": str(tmp_path / "tb"), "job_name": "j"}
    result, launched = train({**MB, "tensorboard": board}, "--gpus", "1")
    line = one_line_error(result, alone=True)
    assert "tensorboard package is not installed; pip install tensorboard" in line and not launched
    assert train({**MB, "tensorboard": {**board, "enabled": False}}, "--gpus", "1")[0].exit_code == 0


@pytest.mark.parametrize("section,value,said", [
    ("csv_monitor", {"enabled": "yes"}, "csv_monitor.enabled must be true or false"),
    ("tensorboard", {"enabled": False, "output_path": 3}, "tensorboard.output_path must be a path as a string"),
    ("wandb", {"enabled": 1}, "wandb.enabled must be true or false"),
])
def test_a_bad_monitor_section_is_refused_when_the_config_is_loaded(section, value, said):
    with pytest.raises(ConfigError, match=said):
        load_config({**MB, section: value}, 1)


def test_csv_monitor_and_tensorboard_are_not_named_as_ignored(capsys, monkeypatch):
    import zero_core.config as config_module

    monkeypatch.setattr(config_module, "_NAMED", set())
    load_config({**MB, "csv_monitor": {"enabled": False}, "tensorboard": {"enabled": False}, "comet": {}}, 1)
    [line] = [x for x in capsys.readouterr().err.splitlines() if x.startswith("zero_core: accepted, not acted on")]
    assert line.startswith("zero_core: accepted, not acted on: comet (") and "csv_monitor (" not in line
    assert "tensorboard (" not in line


@pytest.mark.parametrize("part", ["optimizer", "param"])
def test_a_missing_nvme_folder_is_refused_before_any_rank(train, tmp_path, part):
    missing = tmp_path / "no_such_folder"
    zero = {"stage": 3, f"offload_{part}": {"device": "nvme", "nvme_path": str(missing)}}
    result, launched = train({**MB, "zero_optimization": zero}, "--gpus", "1")
    line = one_line_error(result)
    assert f"offload_{part}.nvme_path '{missing}' does not exist; create it" in line and not launched


def test_cpu_ranks_beyond_four_per_core_are_refused_as_zbench_run_refuses_them(train, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(zbench.cpu_ranks.os, "cpu_count", lambda: 2)
    result, launched = train(None, "--gpus", "9")
    line = one_line_error(result, alone=True)
    assert "9 CPU ranks is more than 4 per core on 2 cores; pass --gpus 8 or fewer" in line and not launched
    assert train(None, "--gpus", "8")[0].exit_code == 0


WARMUP_2 = {**MB, "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 2, "total_num_steps": 4}}}


def test_the_default_warmup_is_not_held_against_the_configs_warmup(train):
    result, launched = train(WARMUP_2, "--gpus", "1", "--steps", "4")
    assert result.exit_code == 0 and launched, result.output
    line = one_line_error(train(WARMUP_2, "--gpus", "1", "--steps", "3", "--warmup", "1")[0], alone=True)
    assert "warmup_num_steps is 2 in the config but --warmup gives 1" in line


@pytest.mark.slow  # a 2-rank CLI run (2.4 s on 2 cores)
def test_an_input_error_a_rank_raises_reaches_the_terminal_as_its_one_line():
    from input_error_workers import raise_input_error
    from zbench.launch import Nodes, RankFailure, launch

    message = "zero_optimization.x is wrong; fix it"
    with pytest.raises(RankFailure) as failed:
        launch(raise_input_error, message, Nodes(1), run_id="input-error", log_dir=None, what="zbench train")
    assert str(failed.value) == f"zbench train failed on rank 0: {message}"


def test_input_problem_tells_input_errors_from_other_failures():
    from zbench.rank_errors import input_problem

    assert input_problem("ConfigError: a is b; set c") == "a is b; set c"
    said = "x must be true or false; fix the config"
    assert input_problem(f"ValueError: {said}") == said
    assert input_problem("ValueError: too many values to unpack") is None
    assert input_problem("RuntimeError: boom; later") is None


def test_a_scenario_names_the_accelerate_num_processes_it_does_not_use(tmp_path):
    from zbench.plan import build_plan

    (tmp_path / "acc.yaml").write_text("distributed_type: DEEPSPEED\ndeepspeed_config: {zero_stage: 2}\n"
                                       "num_processes: 2\n")
    data = tiny_data([{"name": "z", "engine": "zero", "accelerate_config": "acc.yaml"}], gpus=1)
    notes = build_plan(write_scenario(tmp_path, data)).notes
    assert any("variant 'z': its accelerate_config sets num_processes: 2, but the run uses 1 rank(s)" in n
               for n in notes), notes
    agreeing = copy.deepcopy(data)
    agreeing["gpus"] = 2
    assert not any("num_processes" in n for n in build_plan(write_scenario(tmp_path, agreeing, "two")).notes)


def test_a_failed_rank_prints_its_log_lines_then_one_error_line(tmp_path, monkeypatch):
    from zbench.launch import RankFailure

    def fail(job, nproc):
        raise RankFailure("zbench train failed on rank 1 (exit code 1): RuntimeError: boom\n"
                          "  last log line one\n  Traceback line two")

    monkeypatch.setattr(zbench.train_demo, "launch", fail)
    (tmp_path / "ds.json").write_text(json.dumps(MB))
    result = CliRunner().invoke(main, ["train", "--config", str(tmp_path / "ds.json"), "--gpus", "1"])
    lines = result.output.strip().splitlines()
    assert result.exit_code != 0 and lines[-1].startswith("Error: ")
    assert "rank 1" in lines[-1] and "RuntimeError: boom" in lines[-1] and "log lines are above" in lines[-1]
    assert [x for x in lines if x.startswith("Error")] == [lines[-1]]
    assert "  Traceback line two" in lines[:-1]
