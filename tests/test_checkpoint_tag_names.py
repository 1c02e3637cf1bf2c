"""Tag names on their way to and from disk: a tag or a `latest` holding a line break or another control character
is refused in one line, names listed from the folder are shown on one line, DeepSpeed's own tags and `latest`
still load, and a tag whose folder is a symbolic link (or a file) is refused before anything moves."""

from __future__ import annotations

import os
import shutil

import pytest
from ckpt_workers import config
from parity_workers import make_model

import zero_core
from checkpoints import zbench_format as fmt
from checkpoints.paths import inside
from checkpoints.source import CheckpointError
from checkpoints.tag_folder import TagNotReplaceable


@pytest.fixture(scope="module")
def engine():
    return zero_core.initialize(make_model(), config(2, 1))


def _one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert len(text.splitlines()) == 1 and "\n" not in text, repr(text)
    return text


@pytest.mark.parametrize("tag", ["a\nb", "a\rb", "a\tb", "a\x1bb", "a\x7fb", "a\x85b", "a\u2028b", "a\u2029b",
                                 "\ufeffstep", "a\u202eb", "a\u200bb"])
def test_a_tag_with_a_control_or_invisible_character_is_refused_before_anything_is_written(engine, tmp_path, tag):
    with pytest.raises(CheckpointError) as e:
        engine.save_checkpoint(tmp_path, tag=tag)
    assert "control or invisible character" in _one_line(e)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(CheckpointError) as e:
        engine.load_checkpoint(tmp_path, tag=tag)
    assert "control or invisible character" in _one_line(e)


@pytest.mark.parametrize("pointer", ["global_step2\nglobal_step3", "global_step2\u2028global_step3",
                                     "\ufeffglobal_step2"])
def test_a_latest_of_several_lines_or_hidden_characters_is_refused_in_one_line(engine, tmp_path, pointer):
    engine.save_checkpoint(tmp_path, tag="global_step2")
    (tmp_path / "latest").write_text(pointer, encoding="utf-8")
    with pytest.raises(CheckpointError) as e:
        engine.load_checkpoint(tmp_path)
    line = _one_line(e)
    assert f"tag named by {tmp_path / 'latest'}:" in line and "control or invisible character" in line, line


@pytest.mark.parametrize("pointer", ["global_step10", "global_step10\n"])
def test_deepspeed_tags_and_its_latest_with_or_without_a_newline_still_load(engine, tmp_path, pointer):
    engine.save_checkpoint(tmp_path, tag="global_step10")
    (tmp_path / "latest").write_text(pointer, encoding="utf-8")
    path, _ = engine.load_checkpoint(tmp_path)
    assert path == os.path.join(tmp_path, "global_step10", "rank_00000.safetensors")


def test_tags_listed_from_the_folder_are_shown_on_one_line(engine, tmp_path):
    engine.save_checkpoint(tmp_path, tag="global_step2")
    os.rename(tmp_path / "global_step2", tmp_path / "a\nb")  # a folder named by hand, not through save
    with pytest.raises(CheckpointError) as e:
        engine.load_checkpoint(tmp_path)
    assert "tags present: 'a\\nb'" in _one_line(e)


def test_a_link_named_in_a_file_is_shown_on_one_line(tmp_path):
    os.symlink("/elsewhere\nline", tmp_path / "x\ny")
    with pytest.raises(CheckpointError) as e:
        inside(tmp_path, "x\ny", what="rank file")
    assert "'/elsewhere\\nline'" in _one_line(e)


def _tree(root):
    return sorted((str(p.relative_to(root)), p.is_symlink()) for p in root.rglob("*"))


def test_saving_over_a_tag_that_is_a_link_is_refused_and_touches_neither_link_nor_target(engine, tmp_path,
                                                                                         monkeypatch):
    other, root = tmp_path / "other", tmp_path / "ck"
    engine.save_checkpoint(other, tag="global_step2")
    engine.save_checkpoint(root, tag="global_step1")
    os.symlink(other / "global_step2", root / "linked")
    before = _tree(tmp_path)
    staged = []
    real_staging_dir = fmt.staging_dir
    monkeypatch.setattr(fmt, "staging_dir", lambda *a: staged.append(a) or real_staging_dir(*a))
    with pytest.raises(CheckpointError) as e:
        engine.save_checkpoint(root, tag="linked")
    line = _one_line(e)
    assert f"{root / 'linked'} is a symbolic link" in line and "delete the link" in line, line
    assert _tree(tmp_path) == before  # no set-aside copy, no staging folder, `latest` unchanged
    assert staged == []  # refused up front, before any rank wrote a file
    assert (root / "latest").read_text().strip() == "global_step1"


def test_saving_over_a_tag_that_is_a_file_is_refused(engine, tmp_path):
    (tmp_path / "notes").write_text("mine")
    with pytest.raises(CheckpointError) as e:
        engine.save_checkpoint(tmp_path, tag="notes")
    assert "is a file, not a checkpoint folder" in _one_line(e)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes"]
    assert (tmp_path / "notes").read_text() == "mine"


def test_a_folder_named_latest_is_refused_before_anything_is_written(engine, tmp_path):
    (tmp_path / "latest").mkdir()
    (tmp_path / "latest" / "notes").write_text("mine")
    with pytest.raises(CheckpointError) as e:
        engine.save_checkpoint(tmp_path, tag="t1")
    assert "latest is a folder, where a save writes the name of the newest tag; move that folder away" in _one_line(e)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["latest", "notes"]  # no tag, no staging, nothing moved


def test_a_save_over_a_folder_that_is_not_a_checkpoint_is_refused_and_keeps_it(engine, tmp_path):
    (tmp_path / "global_step0").mkdir()
    (tmp_path / "global_step0" / "mp_rank_00_model_states.pt").write_bytes(b"a DeepSpeed run's file")
    with pytest.raises(CheckpointError) as e:
        engine.save_checkpoint(tmp_path, tag="global_step0")
    assert "holds files but no zbench checkpoint" in _one_line(e)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["global_step0", "mp_rank_00_model_states.pt"]
    (tmp_path / "empty").mkdir()  # an empty folder holds nothing to lose: the save takes it
    engine.save_checkpoint(tmp_path, tag="empty")
    engine.save_checkpoint(tmp_path, tag="empty")  # and a checkpoint of its own format is replaced, as before
    assert (tmp_path / "empty" / "manifest.json").is_file()


def test_a_link_that_appears_during_a_save_is_not_moved_aside_by_the_commit(engine, tmp_path):
    engine.save_checkpoint(tmp_path, tag="target")
    staged = fmt.staging_dir(tmp_path, "linked", fmt.new_token())
    shutil.copytree(tmp_path / "target", staged)
    os.symlink(tmp_path / "target", tmp_path / "linked")
    with pytest.raises(TagNotReplaceable):
        fmt.commit(tmp_path, "linked", staged)
    assert (tmp_path / "linked").is_symlink() and staged.is_dir() and not list(tmp_path.glob(".linked.old-*"))


def test_a_dangling_link_named_like_a_set_aside_copy_stays_and_other_tags_still_save(engine, tmp_path):
    engine.save_checkpoint(tmp_path, tag="best")
    os.rename(tmp_path / "best", tmp_path / ".best.old-4194303-abcd")  # a replacement that died (no such pid)
    os.symlink(tmp_path / "gone", tmp_path / "best")
    engine.save_checkpoint(tmp_path, tag="other")
    assert (tmp_path / "best").is_symlink() and (tmp_path / ".best.old-4194303-abcd").is_dir()


def test_latest_holds_the_tag_alone_as_deepspeed_writes_it(engine, tmp_path):
    """Scripts join `latest`'s text to the folder (os.path.join(dir, open(dir + "/latest").read()))."""
    engine.save_checkpoint(tmp_path, tag="global_step7")
    assert (tmp_path / "latest").read_bytes() == b"global_step7"
    assert os.path.isdir(os.path.join(tmp_path, (tmp_path / "latest").read_text()))


@pytest.mark.parametrize("sub, cause", [("", "the path exists and is not a folder"),
                                        ("inner", "a part of the path is a file, not a folder")])
def test_a_save_dir_that_is_a_file_is_named_with_the_fix(engine, tmp_path, sub, cause):
    (tmp_path / "notes").write_text("mine")
    with pytest.raises(CheckpointError) as e:
        engine.save_checkpoint(tmp_path / "notes" / sub if sub else tmp_path / "notes")
    assert f"({cause}); move that file away or pass another save_dir" in _one_line(e)
    assert (tmp_path / "notes").read_text() == "mine"
