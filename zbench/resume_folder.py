"""What `zbench run --resume DIR` requires of DIR, checked before anything launches or is written.

The run keeps DIR's finished rows by name and replaces every other file it writes there (the table, the CSV,
the plots), so DIR must be a folder `zbench run` made (its marker; in a folder written before the marker, a
finished row or the summary) from the same scenario file. Each row it keeps must be the runner's row of the
variant its file is named after. Each path the run writes must be absent or of the kind the runner writes
there (a folder where a file goes fails only at the end, after every launch), and none may leave DIR through
a symbolic link planted in it.
"""

from __future__ import annotations

import os
from typing import Any

from .run_folder import PROBE_LOG, RUN_MARKER, run_path
from .run_summary import NotARunFolder, load_kept, load_summary

OUTPUT_FILES = ("results.json", "results.csv", "table.md", "throughput.png", "memory.png", "loss.png", "floor.json",
                RUN_MARKER)
OUTPUT_FOLDERS = ("variants", "logs", "checkpoints", "wandb", "logs/floor")
MAX_ROWS_LISTED = 1024  # row files of variants/ tried as evidence in a folder without the marker


def _of_kind(run_dir: str, rel: str, folder: bool) -> None:
    """`rel` (joined by run_path already) is absent, a folder where the run keeps one, or a file where it writes one."""
    path = os.path.join(run_dir, rel)
    if not os.path.lexists(path) or (os.path.isdir(path) if folder else os.path.isfile(path)):
        return
    if folder:
        raise NotARunFolder(f"--resume {run_dir}: {rel} is a file where zbench run keeps a folder; move it out of "
                            "the folder or start a new run")
    what = "a folder" if os.path.isdir(path) else "not a regular file"
    raise NotARunFolder(f"--resume {run_dir}: {rel} is {what} where zbench run writes a file; move it out of the "
                        "folder or start a new run")


def _made_by_zbench_run(run_dir: str) -> bool:
    """The marker every run folder gets first; in a folder from before the marker, a finished row or the summary."""
    if os.path.isfile(os.path.join(run_dir, RUN_MARKER)):
        return True
    rows = os.path.join(run_dir, "variants")
    try:
        names = sorted(os.listdir(rows))[:MAX_ROWS_LISTED] if os.path.isdir(rows) else []
    except OSError:
        names = []
    for name in names:
        if name.endswith(".json") and not name.endswith(f"{PROBE_LOG}.json"):
            try:
                load_kept(run_dir, os.path.join(rows, name), "row")
                return True
            except NotARunFolder:
                continue
    try:
        load_summary(run_dir)
        return True
    except NotARunFolder:
        return False


def check_resume(run_dir: str, plan: Any) -> None:
    """NotARunFolder or ValueError (one line) unless `plan` may resume in `run_dir`."""
    kept = run_path(run_dir, "scenario.yaml")
    if not os.path.isfile(kept):
        raise NotARunFolder(f"--resume {run_dir} has no scenario.yaml: it is not a zbench run folder; pass a folder "
                            "written by zbench run")
    same = os.path.getsize(kept) == os.path.getsize(plan.path)
    if same:
        with open(kept, "rb") as a, open(plan.path, "rb") as b:
            same = a.read() == b.read()
    if not same:
        raise ValueError(f"--resume {run_dir} was run with another version of the scenario ({kept}); "
                         "resume with that file or start a new run")
    files = list(OUTPUT_FILES)
    folders = list(OUTPUT_FOLDERS)
    for vp in plan.variants:
        files += [f"variants/{vp.name}.json", f"variants/{vp.name}{PROBE_LOG}.json"]
        folders += [f"logs/{vp.name}", f"checkpoints/{vp.name}"]
    for rel in folders + files:
        run_path(run_dir, *rel.split("/"))  # no '..', absolute path or symbolic link on the way
    for rel in folders:
        _of_kind(run_dir, rel, folder=True)
    for rel in files:
        _of_kind(run_dir, rel, folder=False)
    for vp in plan.variants:
        row = run_path(run_dir, "variants", f"{vp.name}.json")
        if os.path.lexists(row):
            load_kept(run_dir, row, "row")
    if plan.scenario.measure_floor and os.path.lexists(run_path(run_dir, "floor.json")):
        load_kept(run_dir, run_path(run_dir, "floor.json"), "floor")
    if not _made_by_zbench_run(run_dir):  # e.g. the folder the scenario file itself lives in
        raise NotARunFolder(f"--resume {run_dir} is not a zbench run folder (it has a scenario.yaml but no "
                            f"{RUN_MARKER}, finished row or results.json of zbench run); pass the folder zbench run "
                            "printed as 'results: DIR'")
