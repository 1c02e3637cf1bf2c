"""`optimizer.state` for the engine's Adam: per trainable parameter `{"step", "exp_avg", "exp_avg_sq"}` of this
rank's partition, read from where the states live (device, host memory or NVMe).

As torch's and DeepSpeed's optimizers, it is empty until the first update is applied, and its keys are the
parameters the optimizer's `param_groups` hold (here the model's own, whose group lists zero_core keeps; at
ZeRO stages DeepSpeed's groups hold flat fp32 partitions instead). A parameter's moments are this rank's
elements of it: its shape where the rank holds all of it (stage 0, one rank), else a 1-D run of its flattened
elements (empty where the rank holds none), as `deepspeed.utils.safe_get_local_optimizer_state` returns them.

Where the states are tensors in memory (device or host, one store) the moments are views: an in-place edit
changes the states, as it does on DeepSpeed's. NVMe or split stores give copies made under inference mode, so
that an in-place edit raises instead of being lost. The mapping itself takes no new keys.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Callable

import torch

from .states import TensorStates

Share = tuple[int, int, torch.Size]  # [start, end) in this rank's partition, the parameter's shape


class PartitionState(Mapping):
    """A live view: every read asks the engine `engine_of()` returns (None: no engine, an empty mapping)."""

    def __init__(self, engine_of: Callable[[], Any]) -> None:
        self._engine_of = engine_of
        self._shares: dict[int, Share] | None = None  # id(parameter) -> its share; the layout never changes

    def engine(self) -> Any:
        """The engine whose states this view reads; None once it is gone (or before it has an optimizer)."""
        engine = self._engine_of()
        return engine if engine is not None and getattr(engine, "optimizer", None) is not None else None

    def _keys(self, engine: Any) -> dict[int, torch.Tensor]:
        """id -> parameter of the groups' parameters, in group order, once an update was applied (before, like
        torch's, none; reading the count is a host sync)."""
        if engine is None or float(engine.optimizer.applied.item()) == 0:
            return {}
        shares = self.shares_of(engine)
        return {id(p): p for g in engine.client_optimizer.param_groups for p in g["params"] if id(p) in shares}

    def shares_of(self, engine: Any) -> dict[int, Share]:
        """id(parameter) -> where this rank's share of it is in the partition, for every parameter it trains."""
        if self._shares is None:
            layout, single = engine.layout, engine.layout.world_size == 1
            shares: dict[int, Share] = {}
            for g in layout.groups:
                shard_lo, shard_hi = layout.shard_range(g.index, 0 if single else engine.rank)
                for s in g.slots:
                    lo, hi = max(shard_lo, s.offset), min(shard_hi, s.offset + s.numel)
                    start = g.partition_offset + max(lo - shard_lo, 0)
                    shares[id(engine.params[s.index])] = (start, start + max(hi - lo, 0), torch.Size(s.shape))
            self._shares = shares
        return self._shares

    def __len__(self) -> int:
        return len(self._keys(self.engine()))

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(list(self._keys(self.engine()).values()))

    def __contains__(self, key: object) -> bool:
        return self._keys(self.engine()).get(id(key)) is key

    def __getitem__(self, key: Any) -> dict[str, torch.Tensor]:
        from ..model_export import settled

        engine = self.engine()
        if self._keys(engine).get(id(key)) is not key:
            raise KeyError(_describe(key))
        settled(engine)  # the states as of the last step: no update in flight or speculated
        start, end, shape = self.shares_of(engine)[id(key)]
        opt = engine.optimizer
        live = isinstance(opt.states, TensorStates)
        with torch.inference_mode():  # a copy: read-only
            out: dict[str, torch.Tensor] = {"step": opt.applied.reshape(()).to("cpu", copy=True)}
        with torch.inference_mode(not live):
            for name in ("exp_avg", "exp_avg_sq"):
                value = opt.states.read(name, start, end)
                value = value if live else value.clone()
                out[name] = value.view(shape) if end - start == shape.numel() else value
        return out

    def __repr__(self) -> str:
        return f"PartitionState({len(self)} parameters)"


def _describe(key: Any) -> str:
    shape = f" of shape {tuple(key.shape)}" if isinstance(key, torch.Tensor) else ""
    return (f"{type(key).__name__}{shape} has no optimizer state: the keys are the parameters of the optimizer's "
            "param_groups, once an update was applied")


def expose_state(engine: Any) -> None:
    """After the engine's optimizer is made or replaced: `engine.optimizer.state`, `state_dict()` and
    `load_state_dict()` answer as the optimizer `initialize` handed back does (DeepSpeed's are one object). A torch
    Adam/AdamW the caller passed is run by zero_core's Adam, so its `state` is pointed at the same view, and what
    its load_state_dict loads goes into the engine's states (state_view_load.py): the moments the caller's
    optimizer shows and loads are the ones the engine updates, as under DeepSpeed."""
    from .client_optimizer import ClientOptimizer
    from .facade import ZeroOptimizer
    from .state_view_load import watch_loads

    opt, handed = engine.optimizer, engine.client_optimizer
    if isinstance(opt, ClientOptimizer):
        return  # the caller's torch optimizer steps on the partition and keeps its own state (client_optimizer.py)
    opt.state_dict, opt.load_state_dict = handed.state_dict, handed.load_state_dict
    if isinstance(handed, ZeroOptimizer):
        opt.state = handed.state
        return
    view = handed.state
    if not isinstance(view, PartitionState):
        view = PartitionState(_weak(engine))
        watch_loads(handed, view)  # once per view: an engine whose optimizer is replaced keeps both
    handed.state = opt.state = view


def _weak(engine: Any) -> Callable[[], Any]:
    import weakref

    return weakref.ref(engine)  # the caller's optimizer may outlive the engine: no cycle holding it
