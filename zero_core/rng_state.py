"""RNG states as plain data, so a checkpoint restores them without evaluating anything it read.

    {"torch": base64 of torch's CPU generator state, "cuda": base64 (CUDA runs),
     "python": {"version": 3, "internal": [625 ints], "gauss_next": null | float}}

Format-1 checkpoints stored Python's state as its repr, `(3, (n0, ..., n624), None)`: that text is
parsed here with a regular expression into the same plain data, never evaluated. `restore_rng`
checks everything first and returns a function that applies it, so a bad state changes nothing.
"""

from __future__ import annotations

import base64
import binascii
import math
import random
import re
from pathlib import Path
from typing import Any, Callable

import torch

from checkpoints.source import CheckpointError

_MT_WORDS = 624  # Mersenne Twister state words; Python's state adds the position as a 625th int
_LEGACY = re.compile(r"\(3, \(((?:\d+, ){624}\d+)\), (None|[-+0-9.eE]+|nan|inf|-inf)\)")


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode()


def capture_rng(device: torch.device) -> dict[str, Any]:
    version, internal, gauss_next = random.getstate()
    state: dict[str, Any] = {
        "torch": _b64(torch.get_rng_state()),
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
    }
    if device.type == "cuda":
        state["cuda"] = _b64(torch.cuda.get_rng_state(device))
    return state


def _python_state(value: Any, version: int) -> tuple[int, tuple[int, ...], float | None] | None:
    """Python's random state from a checkpoint's plain data (or a format-1 repr), or None if malformed."""
    if version == 1 and isinstance(value, str):
        m = _LEGACY.fullmatch(value.strip()) if len(value) < 20_000 else None
        if m is None:
            return None
        gauss = None if m[2] == "None" else float(m[2])
        value = {"version": 3, "internal": [int(x) for x in m[1].split(", ")], "gauss_next": gauss}
    if not isinstance(value, dict) or value.get("version") != 3:
        return None
    internal, gauss = value.get("internal"), value.get("gauss_next")
    if not (
        isinstance(internal, list)
        and len(internal) == _MT_WORDS + 1
        and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**32 for x in internal)
        and internal[-1] <= _MT_WORDS
    ):
        return None
    if gauss is not None and not (isinstance(gauss, float) and math.isfinite(gauss)):
        return None
    return 3, tuple(internal), gauss


def _bytes(text: Any, size: int | None) -> torch.Tensor | None:
    if not isinstance(text, str) or len(text) > 1 << 16:
        return None
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    if size is not None and len(raw) != size:
        return None
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else None


def restore_rng(state: dict[str, Any], version: int, folder: Path) -> Callable[[torch.device], None]:
    """Check rank `state` of a checkpoint in `folder`; return the function that applies it."""
    cpu = _bytes(state.get("torch"), torch.get_rng_state().numel())
    py = _python_state(state.get("python"), version)
    if cpu is None or py is None:
        raise CheckpointError(
            f"{folder}: a saved RNG state is malformed; the manifest is damaged, use an earlier checkpoint"
        )
    cuda_text = state.get("cuda")

    def apply(device: torch.device) -> None:
        torch.set_rng_state(cpu)
        random.setstate(py)
        if device.type == "cuda" and cuda_text is not None:
            cuda = _bytes(cuda_text, torch.cuda.get_rng_state(device).numel())
            if cuda is not None:
                torch.cuda.set_rng_state(cuda, device)

    return apply
