"""Files someone else put inside a checkpoint's tag folder survive every save: a re-save of that tag is refused in
one line naming them (DeepSpeed's re-save writes its own files over and leaves others' beside them; zbench's
replaces the whole folder, so it would delete them), and keep_last leaves such a folder where it is."""

from __future__ import annotations

import pytest
from ckpt_workers import _train, config
from helpers import snapshot
from parity_workers import make_model

from checkpoints import zbench_format as fmt
from checkpoints.source import CheckpointError


@pytest.fixture
def engine():
    import zero_core

    engine = zero_core.initialize(make_model(), config(2, 1))
    _train(engine, 0, 1, range(1))
    yield engine
    engine.close()


@pytest.mark.parametrize("async_save", [False, True])
def test_a_resave_of_a_tag_holding_anothers_file_is_refused_and_keeps_it(engine, tmp_path, async_save):
    root = tmp_path / "ckpt"
    engine.save_checkpoint(root, tag="best")
    (root / "best" / "notes.txt").write_text("mine")
    (root / "best" / "eval").mkdir()
    before = snapshot(root)
    _train(engine, 0, 1, range(1, 2))
    with pytest.raises(CheckpointError, match=r"best holds .*(eval, notes\.txt|notes\.txt, eval).* move them") as e:
        engine.save_checkpoint(root, tag="best", async_save=async_save)
        engine.wait_for_checkpoint()
    assert "\n" not in str(e.value)
    assert snapshot(root) == before  # nothing moved, nothing deleted, no staging folder left
    (root / "best" / "notes.txt").unlink()
    (root / "best" / "eval").rmdir()
    engine.save_checkpoint(root, tag="best", async_save=async_save)  # once they are moved away, the re-save goes
    engine.wait_for_checkpoint()
    assert fmt.read_latest(root) == "best"


def test_keep_last_leaves_a_checkpoint_holding_anothers_file(engine, tmp_path, capsys):
    root = tmp_path / "ckpt"
    engine.save_checkpoint(root, keep_last=1)
    (root / "global_step1" / "notes.txt").write_text("mine")
    kept = snapshot(root / "global_step1")
    _train(engine, 0, 1, range(1, 3))
    engine.save_checkpoint(root, keep_last=1)
    engine.save_checkpoint(root, keep_last=1)  # global_step2 is pruned as before
    assert snapshot(root / "global_step1") == kept
    assert sorted(p.name for p in root.iterdir()) == ["global_step1", "global_step3", "latest"]
    out = capsys.readouterr().out
    assert "global_step1 was not pruned" in out and "notes.txt" in out


def test_a_file_put_in_the_tag_while_its_resave_writes_is_kept(engine, tmp_path, monkeypatch):
    from zero_core import checkpointing

    root = tmp_path / "ckpt"
    engine.save_checkpoint(root, tag="best")
    real = checkpointing.write_files

    def user_writes_meanwhile(*args):
        (root / "best" / "notes.txt").write_text("mine")
        return real(*args)

    monkeypatch.setattr(checkpointing, "write_files", user_writes_meanwhile)
    before_manifest = (root / "best" / "manifest.json").read_bytes()
    with pytest.raises(CheckpointError, match="notes.txt, which no save wrote"):
        engine.save_checkpoint(root, tag="best")
    assert (root / "best" / "notes.txt").read_text() == "mine"
    assert (root / "best" / "manifest.json").read_bytes() == before_manifest  # the old copy stands
    assert sorted(p.name for p in root.iterdir()) == ["best", "latest"]  # the staging folder removed
