"""The accumulation window after `engine.no_sync()`: the backwards run inside it were not micro-steps of their own
(no `step()` followed them), so the window's count of backwards, not the micro-step count, says whether the next
backward adds to gradients already reduced in this window (stages 2-3 reduce every backward). Until the window's
update, its boundary is the micro-step count's, kept in `_boundary_set`, which makes engine.backward count the
window's passes; after it the engine goes back to counting micro-steps."""

from __future__ import annotations

from typing import Any


def follow_no_sync_window(engine: Any) -> None:
    """Called where the engine asks for its boundary (each backward and step)."""
    if not engine.__dict__.get("_no_sync_window") or engine.__dict__.get("_in_no_sync"):
        return
    if engine._window_passes == 0:  # the window's update ran (or no backward ran inside the context)
        engine.__dict__["_no_sync_window"] = False
        engine._boundary_set = None
    else:
        engine._boundary_set = (engine.micro_steps + 1) % engine.gradient_accumulation_steps() == 0
