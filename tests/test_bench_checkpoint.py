"""`zbench bench checkpoint` measures every system it can import, beside the disk floor, and writes its record."""

from __future__ import annotations

import importlib.metadata

import pytest

from helpers import cli, zbench


def _installed(dist: str) -> bool:
    """The distribution, not a module of that name (the drop-in tests alias `deepspeed` to zero_core's)."""
    try:
        importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.slow
def test_bench_checkpoint_runs_small_on_the_cpu(tmp_path):
    record = tmp_path / "rec.md"
    # its own process: the engines it builds need a process group of their own, not one a test left behind
    result = zbench("bench", "checkpoint", "--params", "300000", "--dir", str(tmp_path), "--record", str(record))
    assert result.returncode == 0, result.stderr[-3000:]
    text = record.read_text()
    for row in ("| zero_core | async buffers: initialize to ",
                "| zero_core | save (sync, durable)", "| zero_core | save (async): training blocked",
                "| zero_core | save (async): durable after", "| zero_core | load (cold cache)",
                "| zbench convert | to fp32 safetensors, verified", "| DCP | save (async): training blocked",
                "| DCP | load (cold cache)"):
        assert row in text, row
    if _installed("deepspeed"):  # an optional peer: its rows only where it is installed
        for row in ("| DeepSpeed | load (cold cache)", "| zbench convert of DeepSpeed's | to fp32 safetensors",
                    "| DeepSpeed | zero_to_fp32 to safetensors"):
            assert row in text, row
    assert "Disk floor in" in text and "write" in text and "disk floor:" in result.stdout
    assert [p.name for p in tmp_path.iterdir()] == ["rec.md"]  # its checkpoints removed


def test_bench_checkpoint_refuses_a_missing_dir(tmp_path):
    from helpers import one_line_error

    assert "is not a folder" in one_line_error(cli("bench", "checkpoint", "--dir", tmp_path / "nope"))
