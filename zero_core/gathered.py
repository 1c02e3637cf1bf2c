"""Whole parameters on demand: `GatheredParameters(params, modifier_rank=None)`, as DeepSpeed's zero.GatheredParameters.

Inside the context every listed parameter of a zero_core engine holds its full, current value on every
rank (at stage 3 its units are gathered and kept; at stages 0-2 the weights are already whole). With
`modifier_rank=r`, what rank r wrote into them is broadcast on exit and becomes the fp32 master weights,
so training goes on from it. Collective: every rank enters with the same parameters. A model built inside
`init_context` that no engine owns yet is made whole first (deferred/early.py), and rank r's writes are
broadcast on exit, as DeepSpeed does for parameters partitioned by zero.Init. Other parameters that no
engine owns are left alone, so the same code runs without zero_core.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from .deferred.early import broadcast_modified, made_whole, make_whole

_OWNER: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()  # id(parameter) -> Engine


def register(engine: Any) -> None:
    for p in engine.module.parameters():
        _OWNER[id(p)] = engine


class GatheredParameters:
    def __init__(
        self, params: Any, modifier_rank: int | None = None, fwd_module: Any = None, enabled: bool = True
    ) -> None:
        if isinstance(params, torch.Tensor):
            params = [params]
        self.params = [p for p in params if p is not None] if enabled and params is not None else []
        self.modifier_rank = modifier_rank
        self._held: list[tuple[Any, list[int]]] = []
        self._early: list[torch.Tensor] = []  # parameters of a model made whole before initialize

    def _by_engine(self) -> list[tuple[Any, list[torch.Tensor]]]:
        engines: dict[int, tuple[Any, list[torch.Tensor]]] = {}
        for p in self.params:
            engine = _OWNER.get(id(p))
            if engine is not None:
                engines.setdefault(id(engine), (engine, []))[1].append(p)
        return list(engines.values())

    def __enter__(self) -> "GatheredParameters":
        unowned = [p for p in self.params if id(p) not in _OWNER]
        make_whole([p for p in unowned if p.device.type == "meta"])
        self._early = [p for p in unowned if made_whole(p)]
        for engine, params in self._by_engine():
            groups = engine.strategy.groups_of(params)
            engine.strategy.hold(groups)
            self._held.append((engine, groups))
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.modifier_rank is not None and exc[0] is None and self._early:
            broadcast_modified(self._early, self.modifier_rank)
        self._early = []
        for engine, groups in self._held:
            try:
                if self.modifier_rank is not None and exc[0] is None:
                    with torch.no_grad():
                        engine.strategy.take_modified(groups, self.modifier_rank, engine.optimizer.states)
            finally:
                engine.strategy.let_go(groups)
        self._held = []
