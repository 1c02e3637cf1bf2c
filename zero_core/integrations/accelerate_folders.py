"""Where zero_core's Accelerator saves and loads its state: the folder given, or, with
`ProjectConfiguration(automatic_checkpoint_naming=True)`, Accelerate's own layout: `<project_dir>/checkpoints/
checkpoint_<iteration>`, the oldest removed beyond `total_limit`, the iteration counted up after each save, and a
`load_state()` without a folder taking the highest-numbered one.
"""

from __future__ import annotations

import os
import re
import shutil
from typing import Any

_NUMBERED = re.compile(r"checkpoint_(\d+)")


def _numbered(root: str) -> list[tuple[int, str]]:
    """(iteration, path) of each checkpoint_N folder under `root`, oldest first."""
    found = []
    for name in os.listdir(root) if os.path.isdir(root) else []:
        match = _NUMBERED.fullmatch(name)
        if match and os.path.isdir(os.path.join(root, name)):
            found.append((int(match.group(1)), os.path.join(root, name)))
    return sorted(found)


def _automatic(accelerator: Any) -> bool:
    return bool(accelerator.project_configuration.automatic_checkpoint_naming)


def save_folder(accelerator: Any, output_dir: Any) -> str:
    """The folder this save writes (collective with automatic naming: the main process makes room first)."""
    if not _automatic(accelerator):
        if output_dir is None:
            raise ValueError(
                "save_state needs output_dir, or ProjectConfiguration(automatic_checkpoint_naming=True) for "
                "numbered folders under project_dir"
            )
        return os.fspath(output_dir)
    config = accelerator.project_configuration
    root = os.path.join(accelerator.project_dir, "checkpoints")
    os.makedirs(root, exist_ok=True)
    held = _numbered(root)
    if config.total_limit is not None and accelerator.is_main_process:
        for _, old in held[: max(0, len(held) + 1 - config.total_limit)]:
            shutil.rmtree(old)
    folder = os.path.join(root, f"checkpoint_{accelerator.save_iteration}")
    if os.path.exists(folder):
        raise ValueError(
            f"{folder} exists already; set accelerator.project_configuration.iteration to the next free number"
        )
    accelerator.wait_for_everyone()
    return folder


def saved(accelerator: Any) -> None:
    """After a save: the next automatic folder is numbered one higher."""
    if _automatic(accelerator):
        accelerator.project_configuration.iteration += 1


def load_folder(accelerator: Any, input_dir: Any) -> str:
    """The folder this load reads: the one given (which must exist), else the newest automatic one."""
    if input_dir is not None:
        folder = os.path.expanduser(os.fspath(input_dir))
        if not os.path.isdir(folder):
            raise ValueError(f"load_state found no folder at {folder}; name the folder save_state wrote")
        return folder
    if not _automatic(accelerator):
        raise ValueError(
            "load_state needs input_dir, or ProjectConfiguration(automatic_checkpoint_naming=True) to take the "
            "newest numbered folder"
        )
    root = os.path.join(accelerator.project_dir, "checkpoints")
    held = _numbered(root)
    if not held:
        raise ValueError(f"load_state found no checkpoint_N folder in {root}; save_state writes them there")
    return held[-1][1]
