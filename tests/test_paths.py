"""The one containment rule: names from files stay inside their folder, links only when allowed."""

from __future__ import annotations

import os

import pytest

from checkpoints.paths import inside, plain_name
from checkpoints.source import CheckpointError


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "rank_00000.safetensors").write_bytes(b"x")
    (tmp_path / "ckpt" / "sub").mkdir()
    (tmp_path / "secret").write_text("outside")
    os.symlink(tmp_path / "secret", tmp_path / "ckpt" / "link")
    os.symlink(tmp_path / "ckpt" / "rank_00000.safetensors", tmp_path / "ckpt" / "inner link")
    return tmp_path / "ckpt"


def test_a_plain_relative_name_is_accepted(folder):
    assert inside(folder, "rank_00000.safetensors", what="rank file") == folder / "rank_00000.safetensors"
    assert inside(folder, "sub/../rank_00000.safetensors", what="rank file") == folder / "rank_00000.safetensors"


@pytest.mark.parametrize("rel,expected", [("../secret", "points outside"), ("sub/../../secret", "points outside"),
                                          ("/etc/passwd", "absolute path"), ("", "not a file name"),
                                          ("a\0b", "not a file name")])
def test_escapes_are_refused_naming_path_and_folder(folder, rel, expected):
    with pytest.raises(CheckpointError) as e:
        inside(folder, rel, what="chunk file")
    assert expected in str(e.value) and str(folder) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("name", ["link", "inner link"])
def test_links_are_refused_unless_followed(folder, name):
    with pytest.raises(CheckpointError) as e:
        inside(folder, name, what="rank file")
    assert "symbolic link" in str(e.value) and "--follow-symlinks" in str(e.value)
    assert inside(folder, name, what="rank file", follow_symlinks=True) == folder / name


@pytest.mark.parametrize("name,expected", [("../x", "not a plain name"), (".hidden", "not a plain name"),
                                           ("a/b", "not a plain name"), ("x" * 256, "longer than 255 bytes"),
                                           ("é" * 128, "longer than 255 bytes"), ("", "not a name"), (7, "not a name")])
def test_plain_name_refuses_paths_and_long_names(name, expected):
    with pytest.raises(CheckpointError) as e:
        plain_name(name, "tag")
    assert expected in str(e.value) and len(str(e.value)) < 400


def test_plain_name_keeps_ordinary_names():
    assert plain_name("global_step2", "tag") == "global_step2"
    assert plain_name("best-é_1.0", "tag") == "best-é_1.0"
