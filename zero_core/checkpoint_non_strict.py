"""`load_checkpoint(load_module_strict=False)`, as DeepSpeed's `module.load_state_dict(strict=False)`: the model's
entries the checkpoint lacks keep their values and the checkpoint's entries the model lacks are skipped, both named
in one line on rank 0. Shapes must still agree, as torch's non-strict load requires.

A checkpoint's optimizer states belong to the parameters its run trained, so a load that takes them needs the model
to hold the same entries: otherwise one line asks for the weights alone, before anything changes.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from checkpoints.source import CheckpointError


class NameMatch(NamedTuple):
    """The entries a non-strict load leaves out, each list in its owner's order."""

    missing: list[str]  # the model's, not in the checkpoint: they keep the model's values
    unexpected: list[str]  # the checkpoint's, not in the model: skipped

    def __bool__(self) -> bool:
        return bool(self.missing or self.unexpected)


def _some(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _described(found: NameMatch) -> str:
    parts = [f"this model's {_some(found.missing)} not in it"] if found.missing else []
    parts += [f"its {_some(found.unexpected)} not in this model"] if found.unexpected else []
    return "; ".join(parts)


def refuse_states(folder: Path, found: NameMatch, weights_only: bool) -> None:
    """One line when a load that takes the optimizer states meets a checkpoint of other entries."""
    if found and not weights_only:
        raise CheckpointError(
            f"{folder} holds other entries than this model ({_described(found)}), so its optimizer states do not fit "
            "this model; load its weights alone with load_optimizer_states=False (or load_module_only=True)"
        )


def report(folder: Path, found: NameMatch, rank: int) -> None:
    """Name on rank 0 what a non-strict load left out, as torch's load_state_dict returns it."""
    if found and rank == 0:
        print(f"zero_core: loaded {folder} with load_module_strict=False: {_described(found)} (the model's keep "
              "their values, the checkpoint's were skipped)", flush=True)
