"""Config files with comments and trailing commas load as DeepSpeed loads them (it reads them with hjson), with
string contents left alone and JSON errors still pointing at the user's line."""

from __future__ import annotations

import json

import pytest
from config_helpers import error

from zero_core.config import load_config
from zero_core.config_file import read_config_file

COMMENTED = """// written by hand
{
  # ZeRO stage 2, as DeepSpeed's examples comment it
  "train_micro_batch_size_per_gpu": 4, /* per rank */
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.999,],},},
  "zero_optimization": {
    /* several
       lines */
    "stage": 2,
  },
}
"""


def test_comments_and_trailing_commas_load(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(COMMENTED)
    config = load_config(str(path), 2)
    assert config.stage == 2 and config.train_batch_size == 8
    assert read_config_file(str(path))["optimizer"]["params"] == {"lr": 1e-3, "betas": [0.9, 0.999]}


@pytest.mark.parametrize("text", ["a // b", "a # b", "a /* b */ c", 'a \\" # b', "x,}", "https://host/path"])
def test_strings_keep_what_looks_like_comments(tmp_path, text):
    path = tmp_path / "ds.json"
    path.write_text('{"tag": ' + json.dumps(text) + ", # a comment\n}")
    assert read_config_file(str(path)) == {"tag": text}


def test_broken_json_still_names_its_line(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('// header\n# more\n{"train_micro_batch_size_per_gpu": 4,\n "zero_optimization": {"stage": 2]}')
    msg = error(path)
    assert "not valid JSON" in msg and "line 4" in msg


def test_members_on_their_own_lines_need_no_comma(tmp_path):
    """hjson, DeepSpeed's reader, takes a line break between members as their separator: such a file loads."""
    path = tmp_path / "ds.json"
    path.write_text('{"train_micro_batch_size_per_gpu": 4\n "zero_optimization": {"stage": 2}}')
    assert load_config(str(path), 1).stage == 2


@pytest.mark.parametrize("value", ["NaN", "-Infinity"])
def test_nan_or_infinity_is_named(tmp_path, value):
    """Neither is a JSON number, and hjson (DeepSpeed's reader) refuses them: the line says so, not "bad key name"."""
    path = tmp_path / "ds.json"
    path.write_text('{"tag": "NaN", "train_micro_batch_size_per_gpu": ' + value + "}")
    msg = error(path)
    assert "holds NaN or Infinity" in msg and "write a finite number" in msg
