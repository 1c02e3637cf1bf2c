"""The zbench command line: user errors are one line with no traceback; the main job runs end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import cli, one_line_error


@pytest.mark.parametrize(
    "config,expected",
    [
        ({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stgae": 2}}, "did you mean 'stage'"),
        ({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": "two"}}, "zero_optimization.stage"),
        ({"train_batch_size": 5, "train_micro_batch_size_per_gpu": 2}, "not divisible"),
        (
            {"train_micro_batch_size_per_gpu": 2, "fp16": {"enabled": True}, "bf16": {"enabled": True}},
            "enable only one",
        ),
    ],
)
def test_bad_config_file_is_one_line(tmp_path, config, expected):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    before = sorted(os.listdir(tmp_path))
    out = one_line_error(cli("train", "--config", str(path)), alone=True)
    assert expected in out
    assert sorted(os.listdir(tmp_path)) == before  # nothing written next to the input


def test_missing_and_malformed_config(tmp_path):
    assert "cannot read --config" in one_line_error(cli("train", "--config", str(tmp_path / "nope.json")), alone=True)
    broken = tmp_path / "broken.json"
    broken.write_text('{"train_micro_batch_size_per_gpu": 2,')
    assert "not valid JSON" in one_line_error(cli("train", "--config", str(broken)), alone=True)


def test_bad_flags_are_one_line():
    assert "block size" in one_line_error(cli("train", "--seq-len", "5000"), alone=True)
    assert "--numel" in one_line_error(cli("bench", "kernels", "--numel", "lots"), alone=True)


def test_bench_kernels_on_cpu_prints_table():
    result = cli("bench", "kernels", "--numel", "5000", "--device", "cpu")
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if line.startswith("| ")]
    names = " ".join(rows)
    assert "copy fp32" in names and "adamw_step" in names and "reduce_epilogue" in names
    assert "copy fp32 (host)" in names and "host adamw (offload)" in names  # the host's bandwidth, same run
    host_adam = next(r for r in rows if "host adamw (offload)" in r).split("|")
    assert float(host_adam[3]) > 0 and float(host_adam[6]) >= 0  # timed, with its share of the host copy
    assert len(rows) >= 8


@pytest.mark.slow  # seconds of subprocess launches: the full suite runs it
def test_train_two_ranks_learns():
    """The README's main job, shortened: 2 gloo ranks through torch's launcher, loss goes down."""
    proc = subprocess.run(
        [sys.executable, "-m", "zbench.cli", "train", "--gpus", "2", "--stage", "3", "--steps", "12"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    done = [line for line in proc.stdout.splitlines() if line.startswith("done:")]
    assert len(done) == 1, proc.stdout[-2000:]
    first, final = (float(x) for x in done[0].split("loss ")[1].split(",")[0].split(" -> "))
    assert final < first - 0.1
    assert "stage 3 on 2 ranks" in done[0]
