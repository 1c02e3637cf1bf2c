"""A script's uncaught refusal from zero_core (a bad config, a checkpoint, a call it refuses) ends the program with
one `Error:` line and exit status 1, not a traceback; the script's own errors keep theirs, and so does any error
with ZERO_CORE_TRACEBACK=1."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import repo_pythonpath

MODEL = "import torch, zero_core\nmodel = torch.nn.Linear(4, 2)\n"
SCRIPTS = {
    "config": MODEL + "zero_core.initialize(model, {'train_micro_batch_size_per_gpu': 2, 'zero_optimization': "
                      "{'stgae': 2}})\n",
    "checkpoint": MODEL + "engine = zero_core.initialize(model, {'train_micro_batch_size_per_gpu': 2})\n"
                          "import pathlib; d = pathlib.Path('ck'); (d / 't').mkdir(parents=True); "
                          "(d / 'latest').write_text('t')\nengine.load_checkpoint('ck')\n",
    "call": MODEL + "import zero_core.deepspeed as deepspeed\n"
                    "deepspeed.initialize(model=model, model_parameters=model.parameters(), mpu=object(), "
                    "config={'train_micro_batch_size_per_gpu': 2})\n",
}


def _run(code: str, tmp_path, **env: str) -> subprocess.CompletedProcess:
    dropped = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "ZERO_CORE_TRACEBACK")
    clean = {k: v for k, v in os.environ.items() if k not in dropped}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**clean, "PYTHONPATH": repo_pythonpath(), **env})


@pytest.mark.slow  # fresh interpreters importing torch: outside the fast tier
@pytest.mark.parametrize("kind, words", [("config", "unknown key 'zero_optimization.stgae'"),
                                         ("checkpoint", "ck"), ("call", "mpu")])
def test_an_uncaught_refusal_is_one_error_line(kind, words, tmp_path):
    done = _run(SCRIPTS[kind], tmp_path)
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error: ")]
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert len(errors) == 1 and words in errors[0], done.stderr[-3000:]
    (tmp_path / "again").mkdir()
    shown = _run(SCRIPTS[kind], tmp_path / "again", ZERO_CORE_TRACEBACK="1")
    assert shown.returncode == 1 and "Traceback" in shown.stderr and words in shown.stderr


@pytest.mark.slow
def test_the_scripts_own_errors_keep_their_traceback(tmp_path):
    done = _run("import zero_core\nraise ValueError('the script said no')\n", tmp_path)
    assert done.returncode == 1 and "Traceback" in done.stderr
    assert not any(line.startswith("Error: ") for line in done.stderr.splitlines())
    assert "ValueError: the script said no" in done.stderr

