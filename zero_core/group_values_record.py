"""Each optimizer group's weight_decay, eps and betas in a zbench checkpoint (the manifest's
`optimizer.group_values`), beside the lr of each group (`group_lrs`).

The engine reads these from the optimizer's groups at every update (optim/group_values.py), so a loop may have
written them; DeepSpeed's checkpoint keeps its optimizer's param_groups and its load puts them back. A save records
each group's values as plain numbers; a load with the optimizer's states writes them back into the groups. The
manifest reader has already refused values out of range (checkpoints/manifest_state_checks.py), and the load a
record of another number of groups than the optimizer's (check_group_count).
"""

from __future__ import annotations

from typing import Any

from checkpoints.source import CheckpointError

from .optim.group_values import finite_number

KEYS = ("weight_decay", "eps", "betas")


def group_values_record(groups: list[dict]) -> list[dict[str, Any]]:
    """Per group, those of its weight_decay, eps and betas that are numbers (JSON plain data)."""
    record = []
    for group in groups:
        entry: dict[str, Any] = {}
        for key in ("weight_decay", "eps"):
            value = finite_number(group.get(key))
            if value is not None:
                entry[key] = value
        betas = group.get("betas")
        if isinstance(betas, (list, tuple)) and len(betas) == 2:
            pair = [finite_number(b) for b in betas]
            if None not in pair:
                entry["betas"] = pair
        record.append(entry)
    return record


def restore_group_values(groups: list[dict], record: Any) -> list[tuple[float, float]] | None:
    """Write a checked record back into `groups` (only the keys a group holds); the saved betas of every group
    (None where the record does not have them all), for the schedule's next update."""
    if not isinstance(record, list) or len(record) != len(groups):
        return None
    for group, entry in zip(groups, record):
        for key in KEYS:
            if key in entry and key in group:
                group[key] = tuple(entry[key]) if key == "betas" else entry[key]
    if all("betas" in entry for entry in record):
        return [(float(entry["betas"][0]), float(entry["betas"][1])) for entry in record]
    return None


def check_group_count(folder: Any, optimizer_record: dict[str, Any], groups: list[dict]) -> None:
    """Before a load with the optimizer's states changes anything: the saved lr and values of each group go back into
    the optimizer's groups one for one, so a record of another number of groups is refused (DeepSpeed's load
    refuses optimizer states of another number of param groups too), never partly or silently dropped."""
    saved = optimizer_record.get("group_lrs")
    saved = optimizer_record.get("group_values") if saved is None else saved
    if saved is not None and len(saved) != len(groups):
        raise CheckpointError(
            f"{folder} holds the optimizer states of {len(saved)} parameter group(s), but this optimizer has "
            f"{len(groups)}; build its groups as the run that saved it did, or load the weights alone "
            "(load_optimizer_states=False)"
        )
