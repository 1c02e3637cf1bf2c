"""A convert into a Hugging Face folder killed while it copies config and tokenizer files leaves no output folder
that looks complete: those files are written beside the shards before the folder is published, never into it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fault_workers import tiny_checkpoint
from helpers import snapshot

_REPO = Path(__file__).resolve().parent.parent

# zbench convert, killed (no clean-up runs) half-way through writing tokenizer_config.json
_KILLED_CONVERT = """
import os, shutil, sys
real_copy = shutil.copyfile
def killed_mid_copy(src, dst, *args, **kwargs):
    if os.path.basename(dst) == "tokenizer_config.json":
        with open(dst, "w") as f:
            f.write('{"model_max_length": ')
        os._exit(9)
    return real_copy(src, dst, *args, **kwargs)
shutil.copyfile = killed_mid_copy
from zbench.cli import main
main(sys.argv[1:], prog_name="zbench")
"""


def test_convert_killed_while_copying_hf_files_publishes_nothing(tmp_path):
    run = tmp_path / "run"
    tiny_checkpoint(run / "checkpoint-1")
    (run / "config.json").write_text('{"model_type": "gpt2"}')
    (run / "tokenizer_config.json").write_text('{"model_max_length": 1024}')
    before = snapshot(run)
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-c", _KILLED_CONVERT, "convert", str(run / "checkpoint-1"), "--to", "fp32",
                           "--out", str(out)], cwd=_REPO, capture_output=True, text=True)
    assert done.returncode == 9, done.stderr
    assert not os.path.lexists(out)  # no model.safetensors beside a torn tokenizer file under the name asked for
    assert (tmp_path / ".out.zbench-partial").is_dir()  # the killed convert's own leftover, named by the next run
    assert snapshot(run) == before
