"""Several savers on one checkpoint folder: `keep_last` deletes only the saving engine's own checkpoints, a
clean-up that fails after the commit leaves the save standing, and a load whose tag is saved again while it
reads says so instead of calling the checkpoint corrupted."""

from __future__ import annotations

import errno
import shutil

import pytest
import torch
from ckpt_workers import _train, config
from parity_workers import make_model

import zero_core
from checkpoints import zbench_format as fmt
from checkpoints.source import CheckpointError


def _engine(trained_steps: int = 0):
    engine = zero_core.initialize(make_model(), config(2, 1))
    _train(engine, 0, 1, range(trained_steps))  # engines of different weights, as two runs' are
    return engine


def _tags(root) -> list[str]:
    return sorted(t for _, t in fmt.complete_tags(root))


def test_keep_last_deletes_only_the_engines_own_checkpoints(tmp_path):
    earlier = _engine()
    earlier.save_checkpoint(tmp_path, tag="earlier_run")  # not the pruning engine's: kept whatever its step
    a, b = _engine(1), _engine(2)
    for i in range(4):
        _train(a, 0, 1, range(i, i + 1))
        a.save_checkpoint(tmp_path, tag=f"a{i}", keep_last=2)
        b.save_checkpoint(tmp_path, tag=f"b{i}", keep_last=3)  # the same step every time: pruned in save order
    assert _tags(tmp_path) == ["a2", "a3", "b1", "b2", "b3", "earlier_run"]
    assert fmt.read_latest(tmp_path) == "b3"
    for engine in (earlier, a, b):
        engine.close()


def test_a_tag_another_saver_replaced_is_no_longer_pruned(tmp_path):
    a, b = _engine(1), _engine(2)
    a.save_checkpoint(tmp_path, tag="shared", keep_last=1)
    b.save_checkpoint(tmp_path, tag="shared")  # b's folder now holds that name
    a.save_checkpoint(tmp_path, tag="next", keep_last=1)
    assert _tags(tmp_path) == ["next", "shared"]
    assert torch.equal(zero_core_state(tmp_path, "shared"), b.full_state_dict()["wte.weight"])
    a.close()
    b.close()


def zero_core_state(root, tag) -> torch.Tensor:
    from checkpoints.zbench_source import ZbenchSource

    return ZbenchSource(root / tag).load("wte.weight")


@pytest.mark.parametrize("case", ["replaced copy", "pruned checkpoint"])
def test_a_clean_up_that_fails_after_the_commit_leaves_the_save_standing(case, tmp_path, monkeypatch, capsys):
    engine = _engine()
    engine.save_checkpoint(tmp_path, tag="good")
    _train(engine, 0, 1, range(1))
    capsys.readouterr()

    def busy(path, *args, **kwargs):  # what NFS answers for a file another client holds open
        raise OSError(errno.EBUSY, "Device or resource busy", str(path))

    monkeypatch.setattr(fmt.shutil, "rmtree", busy)
    engine.save_checkpoint(tmp_path, tag="good" if case == "replaced copy" else "newer", keep_last=1)
    monkeypatch.undo()
    out = capsys.readouterr().out
    left = [d.name for d in tmp_path.iterdir() if d.name.startswith(".good.")]
    assert len(left) == 1 and left[0] in out and "could not be deleted" in out and "Device or resource busy" in out
    assert fmt.read_latest(tmp_path) == ("good" if case == "replaced copy" else "newer")
    reloaded = _engine()
    reloaded.load_checkpoint(tmp_path)
    assert reloaded.global_steps == engine.global_steps == 1
    assert torch.equal(reloaded.full_state_dict()["wte.weight"], engine.full_state_dict()["wte.weight"])
    shutil.rmtree(tmp_path / left[0])
    for e in (engine, reloaded):
        e.close()


def test_a_tag_saved_again_while_it_loads_is_named_as_such(tmp_path, monkeypatch):
    import zero_core.checkpoint_load as loading

    first, second = _engine(1), _engine(2)
    first.save_checkpoint(tmp_path, tag="best")
    real_read = loading.read_verified

    def read_after_a_resave(path, record, spans):
        monkeypatch.setattr(loading, "read_verified", real_read)
        second.save_checkpoint(tmp_path, tag="best")  # another process's save of the same tag, mid-load
        return real_read(path, record, spans)

    monkeypatch.setattr(loading, "read_verified", read_after_a_resave)
    reader = _engine()
    with pytest.raises(CheckpointError) as e:
        reader.load_checkpoint(tmp_path, tag="best")
    message = str(e.value)
    assert "was replaced while it was read" in message and "load it again" in message and "\n" not in message
    assert "corrupt" not in message
    reader.load_checkpoint(tmp_path, tag="best")  # the fix it names
    assert torch.equal(reader.full_state_dict()["wte.weight"], second.full_state_dict()["wte.weight"])
    for e in (first, second, reader):
        e.close()
