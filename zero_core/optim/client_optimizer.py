"""Any element-wise torch optimizer (SGD, RMSprop, Adagrad, Adamax, NAdam, ...) run as it is on this rank's
fp32 shards, as DeepSpeed runs a client optimizer.

The caller's optimizer keeps its class, its hyper-parameters and its groups' options; its parameter
groups are rebuilt over views of this rank's fp32 master partition, one view per (bucket, group) run, and
each view's `.grad` is that run's reduced fp32 gradient (clipped by scaling it). Because a torch optimizer
reads its inputs on the host, a step with non-finite gradients is found with one host sync and skipped.
Per-element state tensors (momentum buffers, squared averages) are saved in checkpoints as partition
arrays `state.<name>`, resharded like the master; per-parameter scalars (a step count) as plain numbers.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable

import torch

from .base import Output, Publish
from .device_adam import DeviceAdamW


class ClientOptimizer(DeviceAdamW):
    """The reduced-gradient bookkeeping of DeviceAdamW, with the caller's torch optimizer as the update."""

    def __init__(self, states, client: torch.optim.Optimizer, **kw) -> None:
        super().__init__(states, **kw)
        self.client = client
        self.views: list[tuple[int, int, int, torch.Tensor]] = []  # (lo, hi, group, view of the master)
        by_group: list[list[torch.Tensor]] = [[] for _ in client.param_groups]
        for runs in self.runs:
            for lo, hi, g in runs:
                view = self.master[lo:hi]
                self.views.append((lo, hi, g, view))
                by_group[g].append(view)
        client.param_groups = [{**{k: v for k, v in pg.items() if k != "params"}, "params": by_group[g]}
                               for g, pg in enumerate(client.param_groups)]
        client.state = defaultdict(dict)

    @property
    def state(self) -> Any:
        """The caller's optimizer's own state, keyed by the views of the master its groups now hold (this rank's
        flat fp32 partition, as DeepSpeed's ZeRO optimizers key it): `engine.optimizer.state` is the same object."""
        return self.client.state

    @state.setter
    def state(self, value: Any) -> None:
        self.client.state = value  # as DeepSpeed's wrapper sets its wrapped optimizer's

    def state_dict(self) -> dict[str, Any]:
        """The caller's optimizer's own: `engine.optimizer` answers as the optimizer `initialize` handed back."""
        return self.client.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Into the caller's optimizer, whose state this optimizer steps with (its groups hold the partition's
        views, so torch's load keys the state by them), as on DeepSpeed."""
        self.client.load_state_dict(state_dict)

    def _update(self, coef: torch.Tensor, out: Output, publish: Publish | None,
                after_segment: Callable[[int], None] | None) -> None:
        if int(self.overflow.item()) != 0:  # the one host sync: a torch optimizer cannot skip on a device flag
            self._parts = {}
            return
        for pg, lr in zip(self.client.param_groups, self.lr.tolist()):
            if _as_float32(pg["lr"]) != lr:  # a group holding this lr keeps its Python float, as the caller set it
                pg["lr"] = lr
        starts = [start for start, _ in self.segments]
        for lo, hi, _, view in self.views:
            i = max(k for k, s in enumerate(starts) if s <= lo)
            start, n = self.segments[i]
            view.grad = self.gradient(start, n)[lo - start : hi - start] * coef
        self.client.step()
        for *_, view in self.views:
            view.grad = None
        for i in self.segment_order or range(len(self.segments)):
            start, n = self.segments[i]
            if out is not None:
                (out[i] if isinstance(out, list) else out[start : start + n]).copy_(self.master[start : start + n])
            if after_segment is not None:
                after_segment(i)
        self._parts = {}

    # -- checkpoints ------------------------------------------------------------------------------------
    def state_arrays(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """({"state.<name>": a partition-sized fp32 array}, {name: a scalar every view shares})."""
        arrays: dict[str, torch.Tensor] = {}
        scalars: dict[str, Any] = {}
        for lo, hi, _, view in self.views:
            for key, value in self.client.state.get(view, {}).items():
                if isinstance(value, torch.Tensor) and value.shape == view.shape:
                    array = arrays.setdefault(f"state.{key}", torch.zeros(self.states.numel, dtype=torch.float32,
                                                                          device=self.master.device))
                    array[lo:hi].copy_(value)
                else:
                    number = value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value
                    if not isinstance(number, (int, float)) or scalars.setdefault(key, number) != number:
                        raise ValueError(f"{type(self.client).__name__}'s state '{key}' is neither per element nor one "
                                         "number shared by every parameter; zero_core cannot checkpoint it")
        return arrays, scalars

    def load_state_arrays(self, arrays: dict[str, torch.Tensor], scalars: dict[str, Any]) -> None:
        """Rebuild the client's state from checkpoint arrays (partition-sized, this rank's) and shared scalars."""
        self.client.state = defaultdict(dict)
        for lo, hi, _, view in self.views:
            state = {k.removeprefix("state."): a[lo:hi].to(view.device).clone() for k, a in arrays.items()}
            state.update({k: torch.tensor(float(v)) for k, v in scalars.items()})
            self.client.state[view] = state


def _as_float32(value: Any) -> float:
    """`value` (a number or a one-element tensor) rounded to float32, as the device holds an lr."""
    return float(torch.as_tensor(value).to(torch.float32))
