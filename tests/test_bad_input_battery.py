"""Reliability battery, bad input: every command given something wrong answers with one `Error:` line that
names the problem, exits non-zero, prints no traceback, and leaves the disk as it was."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from zbench.cli import main

REPO = Path(__file__).resolve().parent.parent


def _snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


@pytest.fixture
def box(tmp_path: Path) -> Path:
    """A folder of inputs, good and bad, that the cases point at."""
    (tmp_path / "empty.json").write_text("")
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "typo.json").write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stgae": 2}}))
    (tmp_path / "bad type.json").write_text(json.dumps({"train_micro_batch_size_per_gpu": "two"}))
    (tmp_path / "truncated.json").write_text('{"train_micro_batch_size_per_gpu": 2, "zero_optimiz')
    (tmp_path / "dup.json").write_text('{"train_micro_batch_size_per_gpu": 2, "train_micro_batch_size_per_gpu": 4}')
    (tmp_path / "nvme.json").write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {
        "stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/x"}}}))
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("not a checkpoint")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("precious")
    (tmp_path / "scenario typo.yaml").write_text((REPO / "scenarios" / "quickstart.yaml").read_text().replace("seq_len:", "seq_lne:"))
    (tmp_path / "scenario empty.yaml").write_text("")
    (tmp_path / "scenario list.yaml").write_text("- 1\n- 2\n")
    (tmp_path / "not yaml.yaml").write_text("name: [unclosed\n")
    (tmp_path / "model.json").write_text("{}")
    (tmp_path / "dcp fake").mkdir()
    (tmp_path / "dcp fake" / ".metadata").write_bytes(b"\x80\x04garbage")
    (tmp_path / "ds fake" / "global_step1").mkdir(parents=True)
    (tmp_path / "ds fake" / "latest").write_text("global_step1")
    (tmp_path / "ds fake" / "global_step1" / "mp_rank_00_model_states.pt").write_bytes(b"PK\x03\x04 truncated")
    return tmp_path


DS = str(REPO / "tests" / "fixtures" / "deepspeed" / "2_2_fp32")
CASES = [
    # zbench train
    (["train", "--config", "{b}/missing.json"], "cannot read"),
    (["train", "--config", "{b}/empty.json"], "not valid JSON"),
    (["train", "--config", "{b}/truncated.json"], "not valid JSON"),
    (["train", "--config", "{b}/list.json"], ""),
    (["train", "--config", "{b}/typo.json"], "did you mean 'stage'"),
    (["train", "--config", "{b}/bad type.json"], "train_micro_batch_size_per_gpu"),
    (["train", "--config", "{b}/dup.json"], "train_micro_batch_size_per_gpu"),
    (["train", "--config", "{b}/nvme.json"], "nvme"),
    (["train", "--seq-len", "100000"], "block size"),
    (["train", "--gpus", "0"], ""),
    (["train", "--stage", "4"], ""),
    (["train", "--precision", "fp8"], ""),
    (["bench", "kernels", "--numel", "lots"], "--numel"),
    (["bench", "kernels", "--numel", "-5"], "--numel"),
    # zbench convert / inspect
    (["convert", "{b}/missing", "--to", "fp32", "--out", "{b}/out"], ""),
    (["convert", "{b}/notes", "--to", "fp32", "--out", "{b}/out"], "not a checkpoint"),
    (["convert", DS, "--to", "fp32", "--out", "{b}/full"], "already holds files"),
    (["convert", DS, "--to", "fp32", "--out", "{b}/out", "--tag", "global_step99"], "global_step99"),
    (["convert", DS, "--to", "fp64", "--out", "{b}/out"], ""),
    (["convert", DS, "--to", "fp32", "--out", "{b}/out", "--max-shard-size", "huge"], ""),
    (["convert", DS, "--to", "fp32", "--out", "{b}/out", "--from", "dcp"], ""),
    (["convert", DS, "--to", "zbench", "--world-size", "2", "--out", "{b}/out"], ""),
    (["convert", "{b}/dcp fake", "--to", "fp32", "--out", "{b}/out"], ""),
    (["convert", "{b}/ds fake", "--to", "fp32", "--out", "{b}/out"], ""),
    (["inspect", "{b}/missing"], ""),
    (["inspect", "{b}/notes"], "not a checkpoint"),
    (["inspect", "{b}/ds fake"], ""),
    # zbench run / report / estimate
    (["run", "{b}/missing.yaml"], ""),
    (["run", "{b}/scenario typo.yaml", "--out", "{b}/runs"], "seq_lne"),
    (["run", "{b}/scenario empty.yaml", "--out", "{b}/runs"], ""),
    (["run", "{b}/scenario list.yaml", "--out", "{b}/runs"], ""),
    (["run", "{b}/not yaml.yaml", "--out", "{b}/runs"], ""),
    (["run", str(REPO / "scenarios" / "quickstart.yaml"), "--variants", "nosuch", "--out", "{b}/runs"], "nosuch"),
    (["run", str(REPO / "scenarios" / "quickstart.yaml"), "--gpus", "4096", "--out", "{b}/runs"], ""),
    (["run", str(REPO / "scenarios" / "quickstart.yaml"), "--resume", "{b}/notes", "--out", "{b}/runs"], ""),
    (["report", "{b}/notes"], ""),
    (["estimate", "--model", "{b}/missing.json", "--gpus", "2"], ""),
    (["estimate", "--model", "{b}/model.json", "--gpus", "2"], ""),
]


@pytest.mark.parametrize("args,expected", CASES, ids=[" ".join(a)[:60] for a, _ in CASES])
def test_bad_input(box: Path, args: list[str], expected: str) -> None:
    argv = [a.replace("{b}", str(box)) for a in args]
    before = _snapshot(box)
    result = CliRunner().invoke(main, argv)
    out = result.output.strip()
    assert result.exit_code != 0, out
    assert "Traceback" not in out, out
    errors = [line for line in out.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, out
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), repr(result.exception)
    assert expected in errors[0], errors[0]
    assert _snapshot(box) == before
