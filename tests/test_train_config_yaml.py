"""`zbench train --config` given the seed article's `accelerate config` YAML says what the file is and where it
goes, in one line, and writes nothing."""

from __future__ import annotations

import os
import shutil

from helpers import REPO, cli, one_line_error


def test_accelerate_yaml_as_config_names_the_right_place(tmp_path):
    path = tmp_path / "accelerate_zero2.yaml"
    shutil.copy(os.path.join(REPO, "scenarios", "configs", "accelerate_zero2.yaml"), path)
    out = one_line_error(cli("train", "--config", path, "--gpus", "1", "--steps", "1"), alone=True)
    assert "not valid JSON" in out and "accelerate config" in out and "accelerate_config" in out
    assert sorted(os.listdir(tmp_path)) == ["accelerate_zero2.yaml"]
