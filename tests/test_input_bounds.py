"""Bounds on what users write: scenario numbers, model config values, names that become paths, the run
folder's own files. The battery (test_bad_input_battery.py) runs the commands; these check the rules."""

from __future__ import annotations

import copy
import datetime
import json
import os

import pytest

from bad_run_folder_cases import summary
from helpers import REPO, TINY, cli, one_line_error, tiny_data, write_scenario
from zbench.models.arch_values import check_hf
from zbench.plan import build_plan, transformers_available
from zbench.run_folder import RunFolderError, default_name, name_problem, run_path, write_atomic
from zbench.run_summary import load_summary
from zbench.scenario import ScenarioError, load_scenario, parse_scenario
from zero_core import ConfigError

BASE = tiny_data([{"name": "ddp", "engine": "ddp"}], steps=2, batch_size=2, lr=None)


def parsed(**changes):
    data = copy.deepcopy(BASE)
    data.update(changes)
    return parse_scenario(data)


def error(**changes) -> str:
    with pytest.raises(ScenarioError) as e:
        parsed(**changes)
    return str(e.value)


@pytest.mark.parametrize(
    "changes,expected",
    [
        ({"steps": 10**8}, "steps must be a whole number from 1 to 10,000,000"),
        ({"warmup_steps": -1}, "warmup_steps must be a whole number from 0 to 10,000,000"),
        ({"checkpoint_every": 0}, "checkpoint_every must be a whole number from 1 to 10,000,000"),
        ({"target_len": 2**21}, "target_len must be a whole number from 1 to 1,048,576"),
        ({"seed": -1}, "seed must be a whole number from 0 to 4,294,967,295"),
        ({"max_grad_norm": float("inf")}, "max_grad_norm must be a finite number (x >= 0), got inf"),
        ({"gpu_memory_cap_gib": float("nan")}, "gpu_memory_cap_gib must be a finite number (x > 0), got nan"),
        ({"parity_tol": "1e-3"}, "parity_tol must be a finite number (x > 0), got '1e-3'"),
        ({"batch_search": {"max": 10**6}}, "batch_search.max must be a whole number from 1 to 65,536"),
        (
            {"batch_search": {"start": 3, "max": 7, "multiple_of": 8}},
            "no batch that is a multiple of 8 lies between start 3",
        ),
        ({"model_search": {"key": "n_layer", "values": [1.5]}}, "model_search.values[0] must be a whole number"),
        ({"model": {"arch": TINY, "num_labels": 2.0}}, "model.num_labels must be a whole number from 1 to 1,000,000"),
        ({"data": {"synthetic": {"vocab": 10**8}}}, "data.synthetic.vocab must be a whole number from 1 to 10,000,000"),
        (
            {"data": {"synthetic": {"lengths": {"mean": float("inf"), "std": 1}}}},
            "data.synthetic.lengths.mean must be a finite",
        ),
        (
            {"data": {"synthetic": {}, "eval_fraction": 1}},
            "data.eval_fraction must be a finite number (0 < x < 1), got 1",
        ),
        (
            {"variants": [{"name": "z", "engine": "zero", "stage": 2.0}]},
            "variants[0].stage must be a whole number from 0 to 3",
        ),
        ({"gradient_checkpointing": "yes"}, "gradient_checkpointing must be true or false, got 'yes'"),
        ({"lr": 10**400}, "lr must be a finite number (x > 0), got an integer of 1329 bits"),
    ],
)
def test_scenario_numbers_have_bounds_and_types(changes, expected):
    assert expected in error(**changes)


def test_valid_values_keep_their_meaning():
    sc = parsed(lr=1, seed=2**32 - 1, seq_len=64, comm_timeout_s=30, gradient_checkpointing=True)
    assert sc.lr == 1.0 and isinstance(sc.lr, float) and sc.seed == 2**32 - 1 and sc.comm_timeout_s == 30.0


@pytest.mark.parametrize("name", ["zero2", "ds-zero2", "zero2-b5e7", "deberta_mrpc_b40", "v1.2+fix", "modèle", "_x"])
def test_names_zbench_uses(name):
    assert name_problem(name) is None


@pytest.mark.parametrize(
    "name,expected",
    [
        ("a b", "is not a name zbench uses in paths"),
        ("a,b", "not a name zbench uses"),
        ("-x", "not a name zbench uses"),
        ("x" * 101, "not a name zbench uses"),
        ("..", "is not a plain name"),
        ("a\\b", "is not a plain name"),
        (" a", "is not a plain name"),
        ("", "is not a name;"),
        (7, "is not a name;"),
    ],
)
def test_names_refused(name, expected):
    assert expected in name_problem(name)


def test_default_name_from_the_file_name(tmp_path):
    assert default_name("my scenario") == "my-scenario" and default_name(".hidden") == "hidden"
    assert default_name("...") == "scenario"
    assert load_scenario(write_scenario(tmp_path, BASE, "my run (2)")).name == "my-run-2"


def test_run_paths_stay_inside_the_run_folder(tmp_path):
    (tmp_path / "run" / "logs").mkdir(parents=True)
    assert run_path(str(tmp_path / "run"), "logs", "ddp") == str(tmp_path / "run" / "logs" / "ddp")
    for parts in (("logs", "../../x"), ("/etc/passwd",), ("..",)):
        with pytest.raises(RunFolderError, match="would lie outside the run folder"):
            run_path(str(tmp_path / "run"), *parts)
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "run" / "variants")
    with pytest.raises(RunFolderError, match="variants/ddp.json would lie outside .*symbolic link"):
        run_path(str(tmp_path / "run"), "variants", "ddp.json")


def test_an_interrupted_write_leaves_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "ddp.json"
    target.write_text("old")
    write_atomic(str(target), "new")
    assert target.read_text() == "new"

    def stop(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", stop)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(str(target), "half")
    assert target.read_text() == "new" and sorted(os.listdir(tmp_path)) == ["ddp.json"]


def test_hf_overrides_keep_the_base_types():
    base = {"hidden_dropout_prob": 0.1, "relative_attention": True, "pos_att_type": ["p2c"], "n_inner": None}

    def check(overrides):
        check_hf(overrides, base, lambda key: f"model.overrides.{key}")

    check({"hidden_dropout_prob": 0, "n_inner": None, "pos_att_type": ["c2p"], "new_key": "x"})  # int for a float
    for overrides, expected in [
        ({"relative_attention": 1}, "must be true or false like the base config's True, got 1"),
        ({"pos_att_type": "p2c"}, "must be a list like the base config's ['p2c'], got 'p2c'"),
        ({"hidden_size": None}, "hidden_size must be a whole number from 1 to 1,048,576, got None"),
        ({"vocab_size": 10**8}, "vocab_size must be a whole number from 1 to 10,000,000"),
        ({"when": datetime.date(2020, 1, 1)}, "model.overrides.when is a date, not a JSON value"),
        ({"eps": [float("nan")]}, "model.overrides.eps is not a finite number"),
    ]:
        with pytest.raises(ConfigError) as e:
            check(overrides)
        assert expected in str(e.value)


@pytest.mark.skipif(not transformers_available(), reason="an hf model config needs transformers")
def test_plan_checks_the_decoder_length(tmp_path):
    blender = os.path.join(REPO, "zbench", "model_configs", "tiny-blenderbot.json")
    seq2seq = {**BASE, "model": {"arch": blender}, "task": "seq2seq", "target_len": 100}
    with pytest.raises(ScenarioError, match="target_len 100 exceeds the 64 positions of 'tiny-blenderbot'"):
        build_plan(write_scenario(tmp_path, seq2seq))


def test_plan_checks_what_ranks_would_fail_on(tmp_path):
    (tmp_path / "a.txt").write_text("some text " * 200)
    text = {**BASE, "model": {"arch": TINY, "overrides": {"vocab_size": 100}}, "data": {"text_files": ["a.txt"]}}
    with pytest.raises(ScenarioError, match="read as bytes .* a vocabulary of 100; name a tokenizer"):
        build_plan(write_scenario(tmp_path, text))
    search = {**BASE, "model_search": {"key": "dropout", "values": [1]}}
    with pytest.raises(ScenarioError, match="model_search.key 'dropout' is not a size field of 'tiny-gpt'; use one of"):
        build_plan(write_scenario(tmp_path, search))


def test_report_refuses_a_huge_results_file_without_reading_it(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with open(run / "results.json", "wb") as f:
        f.truncate(1 << 30)  # 1 GiB, sparse: no disk used
    for args in (["report", str(run)], ["estimate", "--model", TINY, "--run", str(run)]):
        result = cli(*args)
        assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
        assert "is not a zbench run folder (results.json is 1,024 MiB, more than the 256 MiB" in result.output
    assert os.path.getsize(run / "results.json") == 1 << 30 and sorted(os.listdir(run)) == ["results.json"]


def test_report_plots_a_diverged_loss_curve(tmp_path):
    """Losses of ±1e308 (a run that diverged) or missing: the plot leaves a gap where the axes cannot scale."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps(summary(row_losses=[4.2, 1e308, -1e308, None, 4.0])))
    result = cli("report", str(run))
    assert result.exit_code == 0, result.output
    assert (run / "loss.png").stat().st_size > 0


def test_a_minimal_summary_is_a_run(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps(summary()))
    assert load_summary(str(tmp_path))["variants"][0]["variant"] == "ddp"


def test_report_shows_text_from_the_results_file_escaped(tmp_path):
    """A method, note or model name holding a newline, ESC or '|' stays one escaped cell: in the terminal, where
    raw it would restyle the screen or forge a line, and in table.md, where '|' would end the cell."""
    (tmp_path / "results.json").write_text(json.dumps(summary(row_method="a\nb|c\x1b[31mRED", row_note="x\ny",
                                                              model="m\x1b[2J")))
    result = cli("report", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "x\\ny" in result.output and "m\\x1b[2J" in result.output
    rows = [line for line in (tmp_path / "table.md").read_text().splitlines() if line.startswith("| ddp ")]
    assert len(rows) == 1 and "| a\\nb\\|c\\x1b[31mRED |" in rows[0], rows


def test_a_ds_config_path_may_start_at_the_home_folder(tmp_path, monkeypatch):
    """'~' in ds_config reads as in nvme_path and the data paths: the user's home folder."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "b.json").write_text(json.dumps({"zero_optimization": {"stage": 1}}))
    zero = tiny_data([{"name": "z", "engine": "zero", "ds_config": "~/b.json"}], steps=1, batch_size=2)
    assert build_plan(write_scenario(tmp_path, zero)).variants[0].stage == 1


def test_an_error_about_the_output_folder_comes_before_any_note(tmp_path):
    (tmp_path / "a file").write_text("not a folder")
    path = write_scenario(tmp_path, BASE)
    line = one_line_error(cli("run", path, "--out", str(tmp_path / "a file" / "sub"), "--wandb", "off"), alone=True)
    assert "(Not a directory); pass a writable --out" in line


def test_resume_needs_a_folder_zbench_run_made(tmp_path):
    """A folder that only holds the same scenario file (the user's own project folder) is not resumed, since the
    run would replace the table, CSV and plots there; the runner's marker, or a finished row, says zbench made it."""
    from zbench.resume_folder import check_resume
    from zbench.run_folder import mark_run_folder
    from zbench.run_summary import NotARunFolder

    plan = build_plan(write_scenario(tmp_path, BASE))
    for name in ("project", "marked", "with a row"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "scenario.yaml").write_bytes(open(plan.path, "rb").read())
    with pytest.raises(NotARunFolder, match="project is not a zbench run folder .it has a scenario.yaml but no"):
        check_resume(str(tmp_path / "project"), plan)
    mark_run_folder(str(tmp_path / "marked"), "test")
    check_resume(str(tmp_path / "marked"), plan)
    (tmp_path / "with a row" / "variants").mkdir()
    (tmp_path / "with a row" / "variants" / "ddp.json").write_text(json.dumps(summary()["variants"][0]))
    check_resume(str(tmp_path / "with a row"), plan)
