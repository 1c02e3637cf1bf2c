"""Where `zbench run` may write: names it turns into paths, and files replaced whole.

Scenario and variant names become folder and file names (`runs/<scenario>-<time>/`, `logs/<variant>/`,
`variants/<variant>.json`, `checkpoints/<variant>/`). A name is checked once at parse time (`run_name`:
one plain path component, letters, digits and `_ . + -`), and every path is still joined through
`checkpoints.paths.inside` (`run_path`), so nothing reaches outside the run folder, not even through a
symbolic link planted in a folder given to `--resume`. Files are written whole or not at all
(`write_atomic`): an interrupted run never leaves half a row behind.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from pathlib import Path

from checkpoints.paths import inside, plain_name
from checkpoints.source import CheckpointError

MAX_NAME = 100  # characters; also keeps W&B run names and log paths short
_NAME = re.compile(r"\w[\w.+-]*")  # a word character first: no leading '.', '-' (a flag) or '+'
NAME_RULE = f"letters, digits, '_', '.', '+' and '-' (not first), at most {MAX_NAME} characters"
SHOWN_NAME = 60  # characters of a refused name quoted in its message
PROBE_LOG = ".probes"  # variants/<variant>.probes.json, beside the variant's row variants/<variant>.json
RUN_MARKER = ".zbench-run"  # written first into every run folder: --resume asks for it (or a finished row)


_UMASK = os.umask(0o022)  # read once, at import (setting it is the only way to read it), and put back
os.umask(_UMASK)


class RunFolderError(ValueError):
    """A path of the run folder would lie outside it; one line."""


def name_problem(name: object) -> str | None:
    """Why `name` cannot name a run, variant or rendezvous (a sentence after the name), or None."""
    try:
        plain_name(name, what="", fix=f"use {NAME_RULE}")
    except CheckpointError as e:
        return str(e).strip()
    if len(str(name)) > MAX_NAME or not _NAME.fullmatch(str(name)):
        return f"{quoted(str(name))} is not a name zbench uses in paths; use {NAME_RULE}, e.g. 'zero2'"
    return None


def quoted(name: str) -> str:
    """`name` in quotes as a message shows it: escaped, and a long one cut inside the quotes ('abc…')."""
    return repr(name if len(name) <= SHOWN_NAME else name[: SHOWN_NAME - 1] + "…")


def variant_name_problem(name: str) -> str | None:
    """Why `name` cannot name a variant beside the others (a sentence after the name), or None: the row file of
    a name ending in '.probes' would be the probe log of the variant named without it."""
    if name.lower().endswith(PROBE_LOG):
        return (f"{quoted(name)} ends in '{PROBE_LOG}': variants/{name}.json is where zbench keeps the batch probes "
                f"of a variant named {quoted(name[: -len(PROBE_LOG)])}; choose another name")
    return None


def default_name(stem: str) -> str:
    """A run name from a scenario file's name ('my scenario.yaml' -> 'my-scenario')."""
    name = re.sub(r"[^\w.+-]+", "-", stem).strip(".+-")[:MAX_NAME]
    return name if name and not name_problem(name) else "scenario"


def run_path(run_dir: str, *parts: str) -> str:
    """run_dir/parts..., refused (RunFolderError) if it would lie outside run_dir or pass a symbolic link."""
    rel = os.path.join(*parts)
    try:
        return str(inside(run_dir, rel, what="run folder path"))
    except CheckpointError:
        raise RunFolderError(f"{rel} would lie outside the run folder {run_dir} (a '..', an absolute path or a "
                             "symbolic link on the way); zbench writes only inside its run folder: replace the link "
                             "with a real folder, or start a new run") from None


def write_atomic(path: str, data: str | bytes) -> None:
    """Replace `path` with `data` in one rename: readers (and --resume) see the old file or the new one.
    The temporary file is created exclusively (never through a link planted under a guessable name)."""
    folder, name = os.path.split(path)
    fd, tmp = tempfile.mkstemp(dir=folder or ".", prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.chmod(tmp, 0o666 & ~_UMASK)  # what open() would have made; mkstemp's is 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)  # our own temporary file only
        raise


def mark_run_folder(run_dir: str, version: str) -> None:
    """The marker --resume asks of a folder before it replaces files there: written once, first, into every run."""
    marker = run_path(run_dir, RUN_MARKER)
    if not os.path.isfile(marker):
        write_atomic(marker, json.dumps({"zbench": version}) + "\n")


def new_run_dir(out: str, name: str, node_rank: int) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = run_path(out, f"{name}-{stamp}" + (f"-node{node_rank}" if node_rank else ""))
    path, n = base, 1
    while os.path.exists(path):
        n += 1
        path = f"{base}-{n}"
    return path
