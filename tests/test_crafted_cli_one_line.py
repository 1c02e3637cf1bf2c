"""`zbench convert` and `zbench inspect` keep every message on its one line: a path holding a newline or an
escape sequence is printed escaped (in the `Error:` line, the success line and inspect's table), and Ctrl-C is
one `Error:` line with exit status 130 instead of click's "Aborted!", leaving no output and the source as it was."""

from __future__ import annotations

import shutil

from checkpoint_helpers import DEEPSPEED
from helpers import cli, one_line_error, snapshot

SOURCE = next(p for p in DEEPSPEED if p.name == "1_2_fp32")


def test_an_error_naming_a_path_with_a_newline_is_one_line(tmp_path):
    out = tmp_path / "out\nError: forged"
    out.mkdir()
    (out / "kept.txt").write_text("mine")
    before = snapshot(tmp_path)
    line = one_line_error(cli("convert", SOURCE, "--to", "fp32", "--out", out), alone=True)
    assert "out\\nError: forged" in line and "already holds files" in line
    assert snapshot(tmp_path) == before


def test_an_escape_sequence_in_a_source_path_is_shown_escaped(tmp_path):
    src = tmp_path / "not\x1b[2Ja checkpoint"
    src.mkdir()
    line = one_line_error(cli("inspect", src), alone=True)
    assert "\x1b" not in line and "not\\x1b[2Ja checkpoint" in line


def test_success_lines_name_the_paths_escaped(tmp_path):
    src = tmp_path / "ckpt\nstep"
    shutil.copytree(SOURCE, src)
    shown = cli("inspect", src)
    assert shown.exit_code == 0, shown.output
    path_line = next(line for line in shown.output.splitlines() if line.startswith("path"))
    assert "ckpt\\nstep" in path_line
    assert len(shown.output.splitlines()) == len(cli("inspect", SOURCE).output.splitlines())  # no extra line
    done = cli("convert", src, "--to", "fp32", "--out", tmp_path / "out\nput")
    assert done.exit_code == 0, done.output
    assert done.output.strip().splitlines() == [done.output.strip()] and "out\\nput" in done.output
    assert (tmp_path / "out\nput" / "model.safetensors").is_file()


def test_ctrl_c_mid_convert_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    src = tmp_path / "ckpt"
    shutil.copytree(SOURCE, src)
    before = snapshot(src)

    def interrupted(*args, **kwargs):  # Ctrl-C while the output is being written in its staging folder
        raise KeyboardInterrupt

    monkeypatch.setattr("zbench.cli_checkpoints.copy_hf_files", interrupted)
    result = cli("convert", src, "--to", "fp32", "--out", tmp_path / "out")
    line = one_line_error(result, alone=True)
    assert result.exit_code == 130 and "interrupted" in line and "zbench convert" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no output, no staging folder
    assert snapshot(src) == before
