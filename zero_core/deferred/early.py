"""A model built inside `zero_core.init_context` (or `deepspeed.zero.Init`), made whole before any engine owns
it: what `GatheredParameters` needs when a script changes the weights before `initialize`, as DeepSpeed-Chat's
loading and Hugging Face's ZeRO-3 loading do.

The first such context replays the whole construction once (materialise.py) on every rank: the model is then
as if built without the context, its weights on the CPU, bitwise eager construction's. That costs what eager
construction costs (the whole model in host memory on every rank); the recorded modules, found through the
recording, let it be done without the model's root. Inside the context the parameters hold real values, and
what the modifier rank wrote there is broadcast on exit (DeepSpeed's semantics for partitioned parameters);
`initialize` then takes the model as an eager one.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from .. import comm
from .materialise import _PENDING
from .record import storage_key

_MADE_WHOLE: dict[int, Any] = {}  # id(parameter) -> weakref, the parameters this module made whole


def make_whole(params: list[torch.nn.Parameter]) -> None:
    """Every recorded model holding one of `params` (meta tensors no engine owns), real on the CPU."""
    from .shards import materialise_whole

    for p in params:
        if p.device.type != "meta":
            continue  # made whole with an earlier parameter of the same model
        rec = next((r for r in reversed(_PENDING) if storage_key(p) in r.known), None)
        if rec is None:
            raise ValueError(
                f"GatheredParameters got a parameter of shape {tuple(p.shape)} on the meta device that no engine "
                "owns and zero_core.init_context (deepspeed.zero.Init) did not record, so it has no values to "
                "gather; build the model inside the context, or call initialize first"
            )
        root = torch.nn.Module()  # a holder of every recorded module still alive, to find their tensors
        for i, module in enumerate(m for m in (ref() for ref in rec.modules.values()) if m is not None):
            root.add_module(str(i), module)
        materialise_whole(root)
        for q in root.parameters():
            _MADE_WHOLE[id(q)] = weakref.ref(q)


def made_whole(p: torch.Tensor) -> bool:
    ref = _MADE_WHOLE.get(id(p))
    return ref is not None and ref() is p


def broadcast_modified(params: list[torch.Tensor], modifier_rank: int) -> None:
    """What `modifier_rank` wrote into parameters made whole here, on every rank (collective)."""
    with torch.no_grad():
        for p in params:
            comm.broadcast_(p.data, src=modifier_rank, what="broadcast of weights modified before initialize")
