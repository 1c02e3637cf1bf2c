"""Run folders that are not runs for the reliability battery (a helper module, not a test module): `zbench
report`, `estimate --run` and `--resume` on folders whose results.json, rows or layout zbench did not write.

`write_inputs(box)` puts them in the battery's folder; `CASES` are (argv, expected text) in the battery's
format ("{b}" is that folder). Kinds: files that are not JSON objects or not files, values of the wrong
type or out of range, rows that are not one per variant, names that would become paths, paths where the
run writes something of another kind, and a folder that only holds the scenario file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from helpers import QUICKSTART, TINY


def summary(**changes) -> dict:
    """A minimal results.json of a finished run (one measured row), with `changes` on top."""
    row = {
        "variant": "ddp",
        "method": "DDP",
        "engine": "ddp",
        "stage": None,
        "status": "ok",
        "note": "",
        "batch": 8,
        "train_s_per_epoch": 1.0,
        "eval_s_per_epoch": 0.1,
        "eval": {"loss": 4.1, "perplexity": 60.0},
        "tokens_per_s": 1000.0,
        "tflops_per_gpu": 0.01,
        "peak_gpu_gib": None,
        "peak_cpu_gib": 0.3,
        "est_gpu_gib": 0.001,
        "losses": [4.2, 4.1],
        "parity": 0.0,
        "parity_note": "reference",
    }
    data = {
        "scenario": "quickstart",
        "task": "lm",
        "data_kind": "synthetic",
        "init": "random-init",
        "model": "tiny-gpt",
        "precision": "fp32",
        "world_size": 2,
        "device": "cpu",
        "parity_tol": 1e-3,
        "variants": [row],
    }
    for key, value in changes.items():
        (row if key.startswith("row_") else data)[key.removeprefix("row_")] = value
    return data


def write_inputs(box: Path) -> None:
    """The battery's run folders for the cases below, written into `box`."""
    # folders that are not runs, for report, estimate --run and --resume
    for name, content in {
        "run list": "[1, 2]",
        "run shape": json.dumps({"accuracy": 0.9}),
        "run row": json.dumps(summary(row_tokens_per_s="fast")),
        "run task": json.dumps(summary(task="vision")),
        "run name": json.dumps(summary(row_variant="../x")),
        # every field the table, parity and plots read, in its range; the rows one per variant
        "run skips": json.dumps(summary(row_skipped_steps=1, row_skipped_by_step=5)),
        "run no rows": json.dumps(summary(variants=[])),
        "run twice": json.dumps(summary(variants=[summary()["variants"][0]] * 2)),
        "run tol nan": json.dumps(summary(parity_tol=float("nan"))),
        "run world": json.dumps(summary(world_size=2**31)),
        "run speed": json.dumps(summary(row_tokens_per_s=-5.0)),
        "run skip steps": json.dumps(summary(scenario_config={"timing_skip_steps": "x"})),
        "line\nbreak": "{}",
    }.items():
        (box / name).mkdir()
        (box / name / "results.json").write_text(content)
    (box / "run dir" / "results.json").mkdir(parents=True)
    resumed = ("resume row", "resume link", "resume garbage", "resume other", "resume skips", "resume results dir",
               "resume variants file", "resume probes dir", "resume project")
    for name in resumed:
        (box / name).mkdir()
        (box / name / "scenario.yaml").write_bytes(QUICKSTART.read_bytes())
        if name not in ("resume variants file", "resume project"):
            (box / name / "variants").mkdir()
            (box / name / ".zbench-run").write_text("{}")
    (box / "resume row" / "variants" / "ddp.json").write_text("[]")
    (box / "resume garbage" / "variants" / "zero1.json").write_text("{garbage")
    (box / "resume other" / "variants" / "ddp.json").write_text(json.dumps({**summary()["variants"][0],
                                                                            "variant": "zero1"}))
    (box / "resume skips" / "variants" / "ddp.json").write_text(json.dumps({**summary()["variants"][0],
                                                                            "skipped_by_step": 5}))
    (box / "resume results dir" / "results.json").mkdir()
    (box / "resume variants file" / "variants").write_text("")
    (box / "resume probes dir" / "variants" / "zero1.probes.json").mkdir()
    (box / "resume project" / "table.md").write_text("the user's own notes, not a run's table\n")
    (box / "elsewhere").mkdir()
    os.symlink(box / "elsewhere", box / "resume link" / "logs")


R = ["--out", "{b}/runs"]
CASES = [
    (["report", "{b}/run list"], "is not a zbench run folder (results.json holds a JSON list, not an object)"),
    (["report", "{b}/run shape"], "is not a zbench run folder (results.json: it has no scenario)"),
    (["report", "{b}/run row"], "variants[0].tokens_per_s must be a finite number >= 0 (or NaN), got 'fast')"),
    (["report", "{b}/run task"], "(results.json: task "),
    (["report", "{b}/run name"], "(results.json: variants[0].variant '../x' is not a plain name"),
    (["report", "{b}/run dir"], "is not a zbench run folder (results.json is not a regular file)"),
    (["estimate", "--model", TINY, "--run", "{b}/run shape"], "is not a zbench run folder"),
    (["estimate", "--model", TINY, "--run", "{b}/notes"], "is not a zbench run folder (no results.json)"),
    (["report", "{b}/run skips"], "(results.json: variants[0].skipped_by_step is 5: Input should be a valid list"),
    (["report", "{b}/run no rows"], "(results.json: variants lists no row; a run has at least one variant)"),
    (["report", "{b}/run twice"], "(results.json: variants hold two rows of variant 'ddp'; a run has one row per"),
    (["report", "{b}/run tol nan"], "(results.json: parity_tol must be a finite number (x > 0), got nan)"),
    (["report", "{b}/run world"], "(results.json: world_size must be a whole number from 1 to 102,400,000"),
    (["report", "{b}/run speed"], "(results.json: variants[0].tokens_per_s must be a finite number >= 0 (or NaN)"),
    (["report", "{b}/run skip steps"], "(results.json: scenario_config.timing_skip_steps must be a whole number"),
    (["report", "{b}/line\nbreak"], "line\\nbreak is not a zbench run folder (results.json: it has no scenario)"),
    (["run", str(QUICKSTART), "--resume", "{b}/resume row", *R], "variants/ddp.json holds a JSON list, not an object"),
    (["run", str(QUICKSTART), "--resume", "{b}/resume link", *R], "would lie outside the run folder"),
    (
        ["run", str(QUICKSTART), "--resume", "{b}/resume garbage", *R],
        "resume garbage: variants/zero1.json is not valid JSON",
    ),
    (
        ["run", str(QUICKSTART), "--resume", "{b}/resume other", *R],
        "resume other: variants/ddp.json holds the row of 'zero1'; remove it to run ddp again",
    ),
    (
        ["run", str(QUICKSTART), "--resume", "{b}/resume skips", *R],
        "resume skips: variants/ddp.json: skipped_by_step is 5: Input should be a valid list",
    ),
    (
        ["run", str(QUICKSTART), "--resume", "{b}/resume results dir", *R],
        "resume results dir: results.json is a folder where zbench run writes a file",
    ),
    (
        ["run", str(QUICKSTART), "--resume", "{b}/resume variants file", *R],
        "resume variants file: variants is a file where zbench run keeps a folder",
    ),
    (
        ["run", str(QUICKSTART), "--resume", "{b}/resume probes dir", *R],
        "resume probes dir: variants/zero1.probes.json is a folder where zbench run writes a file",
    ),
    (
        ["run", str(QUICKSTART), "--resume", "{b}/resume project", *R],
        "resume project is not a zbench run folder (it has a scenario.yaml but no .zbench-run",
    ),
]
