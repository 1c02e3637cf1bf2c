"""`zero_to_fp32.py` and `zero_to_torch.py` beside `latest`, as DeepSpeed 0.19.8's save_checkpoint leaves them: users
run `python zero_to_fp32.py CHECKPOINT_DIR OUTPUT_DIR` for the fp32 weights, or `python zero_to_torch.py CHECKPOINT_DIR
OUTPUT_DIR --dtype bf16` for another dtype. Ours take DeepSpeed's arguments and write what DeepSpeed's write, through
the calls DeepSpeed's scripts make (convert_zero_checkpoint_to_fp32_state_dict, convert_zero_checkpoint_to_state_dict,
with their flags): pytorch_model.bin by default, safetensors with --safe_serialization, the frozen parameters left out
with --exclude_frozen_parameters.

Rank 0 writes each after a commit, only where the name is free or holds a script this module wrote (recognised by
its marker line): a file of the user's, or DeepSpeed's own script, is never replaced. A file appears whole or
not at all (written aside, then linked or renamed into place). Checkpoint listings look at folders only, so the
files are never taken for a checkpoint, and pruning never touches them."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

NAME = "zero_to_fp32.py"
TORCH_NAME = "zero_to_torch.py"
MARKER = "# zero_core recovery script: engine.save_checkpoint writes and updates this file"
_LARGEST_OURS = 64 * 1024  # ours is far smaller: a larger file is not read, and not ours
_FOREIGN_NOTED: set[tuple[str, str]] = set()  # (folder, name) of another's files this process named: not again


def _script(doc: str, dtype_argument: str, convert: str, dtype_keyword: str) -> str:
    """A standalone converter script (it imports zbench at run time): DeepSpeed's arguments, then `convert`."""
    return f'''#!/usr/bin/env python
{MARKER}
"""{doc}"""

import argparse
import sys

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("checkpoint_dir", help="this folder (the one holding 'latest'), or one checkpoint in it")
parser.add_argument("output_dir", help="a new or empty folder for the weight files"){dtype_argument}
parser.add_argument("--max_shard_size", default="5GB", help="largest file before the output is split")
parser.add_argument("--safe_serialization", action="store_true", help="safetensors instead of pytorch_model.bin")
parser.add_argument("-t", "--tag", default=None, help="the checkpoint's folder name (default: the one 'latest' names)")
parser.add_argument("--exclude_frozen_parameters", action="store_true", help="leave out the frozen parameters")
parser.add_argument("-d", "--debug", action="store_true", help="accepted, no effect")
args = parser.parse_args()
try:
    from zero_core.deepspeed.utils.zero_to_fp32 import {convert}
except ImportError:
    sys.exit("Error: zbench is not installed in this Python; run this script with the Python that trained")
try:
    {convert}(
        args.checkpoint_dir, args.output_dir,{dtype_keyword} max_shard_size=args.max_shard_size,
        safe_serialization=args.safe_serialization, tag=args.tag,
        exclude_frozen_parameters=args.exclude_frozen_parameters)
except (OSError, ValueError) as e:
    sys.exit(f"Error: {{e}}")
'''


SCRIPT = _script("""The fp32 weights of the zbench checkpoint in this folder, as DeepSpeed's zero_to_fp32.py writes
them: python zero_to_fp32.py CHECKPOINT_DIR OUTPUT_DIR [--safe_serialization] [--max_shard_size 5GB] [-t TAG]
[--exclude_frozen_parameters]. pytorch_model.bin (plain tensors), or model.safetensors with --safe_serialization.""",
                 "", "convert_zero_checkpoint_to_fp32_state_dict", "")
TORCH_SCRIPT = _script("""The weights of the zbench checkpoint in this folder in the dtype asked for, as DeepSpeed's
zero_to_torch.py writes them: python zero_to_torch.py CHECKPOINT_DIR OUTPUT_DIR --dtype {fp32,bf16,fp16,...}
[--safe_serialization] [--max_shard_size 5GB] [-t TAG] [--exclude_frozen_parameters]. Floating-point entries take
the dtype.""", """
parser.add_argument("--dtype", choices=("bf16", "bfloat16", "float16", "float32", "fp16", "fp32"), required=True,
                    help="the output tensors' dtype")""", "convert_zero_checkpoint_to_state_dict", " dtype=args.dtype,")
SCRIPTS = {NAME: SCRIPT, TORCH_NAME: TORCH_SCRIPT}


def _current(path: Path, script: str) -> str | None:
    """What `path` holds now: 'absent', 'same' (ours, up to date), 'ours' (an older one of ours) or None (another's:
    a user's file, a symlink, a folder, one unreadable)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "absent"
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_size > _LARGEST_OURS:
        return None
    try:
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if text == script:
        return "same"
    return "ours" if MARKER in text.splitlines()[:3] else None


def _link(aside: str, target: Path) -> None:
    """`aside` as `target`, which is free: a hard link fails if a file appeared there meanwhile (that one is kept);
    where the filesystem has no hard links, a rename after one more look."""
    try:
        os.link(aside, target)
    except FileExistsError:
        raise
    except OSError:
        if os.path.lexists(target):
            raise FileExistsError(str(target)) from None
        os.replace(aside, target)


def place(root: Path) -> str | None:
    """Rank 0, after a commit: put the scripts in `root`; a note when one could not be (the checkpoint stands)."""
    notes = [note for name, script in SCRIPTS.items() if (note := _place(root, name, script)) is not None]
    return "; ".join(notes) or None


def _place(root: Path, name: str, script: str) -> str | None:
    """One script into `root`. A file of another's there is named once per folder, not at every save."""
    target = root / name
    state = _current(target, script)
    if state == "same":
        return None
    if state is None:
        seen = (os.path.realpath(root), name)
        if seen in _FOREIGN_NOTED:
            return None
        _FOREIGN_NOTED.add(seen)
        return f"{name} there is not zero_core's and was left as it is; convert with `zbench convert DIR --to fp32`"
    try:
        fd, aside = tempfile.mkstemp(dir=root, prefix=f".{name}.", suffix=".tmp")
    except OSError as e:
        return f"{name} was not written ({e.strerror})"
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(script)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(aside, 0o755)  # runnable as ./zero_to_fp32.py, as DeepSpeed makes its own
        if state == "absent":
            _link(aside, target)
        else:
            os.replace(aside, target)
    except FileExistsError:
        pass
    except OSError as e:
        return f"{name} was not written ({e.strerror})"
    finally:
        if os.path.lexists(aside):
            os.unlink(aside)
    return None
