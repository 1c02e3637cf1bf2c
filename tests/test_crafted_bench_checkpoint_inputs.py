"""`zbench bench checkpoint` checks what it would fail on before it measures anything: a record whose folder is
missing, a record path holding a file that is not an earlier record (never overwritten), and a --params whose
training state cannot fit this machine's memory, each one `Error:` line with nothing written."""

from __future__ import annotations

import pytest

from helpers import cli, one_line_error, snapshot


def _refused_before_running(*args, **kwargs):
    raise AssertionError("the benchmark ran")


@pytest.fixture
def measured(monkeypatch):
    """Fails the test if the benchmark starts: every case here must be refused before it."""
    monkeypatch.setattr("zbench.bench_checkpoint.run", _refused_before_running)


def test_a_record_in_a_missing_folder_is_refused_first(tmp_path, measured):
    line = one_line_error(cli("bench", "checkpoint", "--params", "1000", "--dir", tmp_path,
                              "--record", tmp_path / "missing" / "rec.md"), alone=True)
    assert "does not exist" in line and "--record" in line
    assert list(tmp_path.iterdir()) == []


def test_a_users_file_is_never_overwritten_but_an_earlier_record_is(tmp_path, monkeypatch):
    notes = tmp_path / "notes.md"
    notes.write_text("my notes\n")
    before = snapshot(tmp_path)
    monkeypatch.setattr("zbench.bench_checkpoint.run", _refused_before_running)
    line = one_line_error(cli("bench", "checkpoint", "--params", "1000", "--dir", tmp_path, "--record", notes),
                          alone=True)
    assert "is not an earlier checkpoint record" in line
    assert snapshot(tmp_path) == before

    record = tmp_path / "rec.md"
    record.write_text("# Checkpoint I/O, one rank: zero_core beside DCP and DeepSpeed (2026-01-01)\n")
    floor = {"write_gbs": 1.0, "read_gbs": 2.0, "o_direct": True}
    info = {"device": "cpu", "params": 1000, "torch": "x", "folder": str(tmp_path), **floor}
    monkeypatch.setattr("zbench.bench_checkpoint.run", lambda params, folder: ([("zero_core", "save", 1.0, 10)], info))
    result = cli("bench", "checkpoint", "--params", "1000", "--dir", tmp_path, "--record", record)
    assert result.exit_code == 0, result.output
    assert "| zero_core | save |" in record.read_text() and "2026-01-01" not in record.read_text()


def test_a_model_beyond_this_machines_memory_is_refused(tmp_path, measured):
    line = one_line_error(cli("bench", "checkpoint", "--params", str(10**14), "--dir", tmp_path,
                              "--record", tmp_path / "rec.md"), alone=True)
    assert "needs 1,600,000.0 GB" in line and "pass a smaller --params" in line
    assert list(tmp_path.iterdir()) == []
