"""A variant's own `gradient_checkpointing` (zbench/scenario.py): it overrides the scenario's, so one table can
hold an engine with and without recompute; recompute leaves the losses as they were."""

from __future__ import annotations

import json

import pytest
from helpers import one_line_error, table, tiny_scenario, zbench


@pytest.mark.slow  # seconds of subprocess launches: the full suite runs it
def test_a_variant_turns_the_scenarios_recompute_off_and_the_rows_say_which(tmp_path):
    path = tiny_scenario(tmp_path, "recompute", [
        {"name": "ddp", "engine": "ddp"},
        {"name": "zero2", "engine": "zero", "stage": 2, "gradient_checkpointing": False},
        {"name": "zero3", "engine": "zero", "stage": 3},
    ], gradient_checkpointing=True)
    out = tmp_path / "runs"
    proc = zbench("run", path, "--out", str(out), "--wandb", "off")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(next(out.glob("*/results.json")).read_text())
    assert {r["variant"]: r["recompute"] for r in summary["variants"]} == {"ddp": True, "zero2": False, "zero3": True}
    rows = table(proc.stdout)
    for name in ("zero2", "zero3"):  # the same losses, recomputed or not
        assert rows[name]["Loss parity vs DDP"].endswith(" ok"), rows[name]


def test_a_variant_recompute_that_is_not_a_flag_is_one_error_line(tmp_path):
    path = tiny_scenario(tmp_path, "bad", [{"name": "zero2", "engine": "zero", "gradient_checkpointing": "yes"}])
    proc = zbench("run", path, "--out", str(tmp_path / "runs"), "--wandb", "off")
    line = one_line_error(proc)
    assert "gradient_checkpointing" in line and "true or false" in line, line
