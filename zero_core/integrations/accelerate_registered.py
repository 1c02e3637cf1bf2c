"""Objects given to `accelerator.register_for_checkpointing` in zero_core's `save_state`/`load_state`.

Accelerate pickles each object's `state_dict()` beside the checkpoint; zero_core's checkpoints hold no pickles,
so the states travel in the checkpoint's JSON `client_state` instead (rank 0's, as Accelerate saves the main
process's), in registration order. A state that JSON would not give back as it was (tensors, arrays, tuples,
keys that are not text) is refused at `save_state`, naming the object.
"""

from __future__ import annotations

from typing import Any

REGISTERED = "accelerate_registered_objects"  # the client_state key


def _not_plain(value: Any, where: str) -> str | None:
    """Where `value` holds something JSON would not give back unchanged, and what; None if nowhere."""
    if value is None or isinstance(value, (bool, int, float, str)):  # inf and nan too: Python's json keeps them
        return None
    if isinstance(value, list):
        return next((w for i, v in enumerate(value) if (w := _not_plain(v, f"{where}[{i}]"))), None)
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                return f"the {type(k).__name__} key {k!r} at {where}"
            if found := _not_plain(v, f"{where}[{k!r}]"):
                return found
        return None
    return f"a {type(value).__name__} at {where}"


def registered_states(objects: list[Any]) -> list[Any]:
    """Each registered object's state_dict(), checked to be plain JSON data."""
    states = []
    for i, obj in enumerate(objects):
        state = obj.state_dict()
        found = _not_plain(state, "state_dict()")
        if found is not None:
            raise ValueError(
                f"registered object {i} ({type(obj).__name__}) has {found}; zero_core's save_state keeps registered "
                "objects as JSON data (numbers, text, lists, dicts with text keys): return only those from its "
                "state_dict(), or save it yourself and drop the registration"
            )
        states.append(state)
    return states


def restore_registered(objects: list[Any], states: Any, folder: Any) -> None:
    """Each object's load_state_dict() with its saved state, in registration order."""
    if not isinstance(states, list) or len(states) != len(objects):
        saved = len(states) if isinstance(states, list) else 0
        raise ValueError(
            f"{folder} holds the states of {saved} registered objects and this Accelerator has {len(objects)} "
            "registered; register the same objects, in the same order, before load_state"
        )
    for obj, state in zip(objects, states):
        obj.load_state_dict(state)
