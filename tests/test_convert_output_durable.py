"""`zbench convert` makes its output durable before it says so: every file it wrote (the shards, the sharded
index, the copied Hugging Face files) and the staging folder are fsynced before the rename that publishes them,
and the folder holding the output after it (a power loss must not bring back the staging name)."""

from __future__ import annotations

import os
from pathlib import Path

from ckpt_workers import _train, config
from helpers import cli
from parity_workers import make_model

import zero_core
from checkpoints.output_claim import staging_dir


def _hf_run(tmp_path: Path) -> Path:
    """A zbench checkpoint in RUN/checkpoint-1 beside a Hugging Face config and tokenizer file, as Trainer leaves."""
    run = tmp_path / "run"
    engine = zero_core.initialize(make_model(), config(2, 1))
    _train(engine, 0, 1, range(1))
    engine.save_checkpoint(run / "checkpoint-1")
    engine.close()
    (run / "config.json").write_text('{"model_type": "gpt2"}')
    (run / "tokenizer_config.json").write_text("{}")
    return run / "checkpoint-1"


def test_convert_fsyncs_its_files_and_folders_around_the_publishing_rename(tmp_path, monkeypatch):
    src, out = _hf_run(tmp_path), tmp_path / "published" / "out"
    events: list[tuple[str, str]] = []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def rename(a, b, **kwargs):
        real_rename(a, b, **kwargs)
        events.append(("rename", f"{os.fspath(a)} -> {os.fspath(b)}"))

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    result = cli("convert", src, "--to", "fp32", "--out", out, "--max-shard-size", "20KB")
    monkeypatch.undo()
    assert result.exit_code == 0, result.output
    staging = staging_dir(out)
    published = events.index(("rename", f"{staging} -> {out}"))
    before = {path for kind, path in events[:published] if kind == "fsync"}
    after = {path for kind, path in events[published + 1:] if kind == "fsync"}
    written = sorted(p.name for p in out.iterdir())
    assert "model.safetensors.index.json" in written and "config.json" in written and len(written) > 4, written
    assert {str(staging / name) for name in written} <= before, sorted(before)  # every file, the index included
    assert str(staging) in before  # the folder's entries
    assert str(out.parent) in after  # the rename itself
