"""Each optimizer group's beta1, beta2, eps and weight_decay, read from the handed-back optimizer's group dict at
every update, as DeepSpeed's optimizers read their `param_groups`: a loop that writes `group["weight_decay"]` (a
weight-decay schedule), `group["eps"]` or `group["betas"]` changes the next update, as it does under DeepSpeed.

`follow_group_values(engine)` puts a `GroupValues` in place of each fixed `Hyper` of the engine's partition
optimizer (in place: an optimizer rebuilt later, `offload_optimizer.ratio: "auto"`, shares the same list)."""

from __future__ import annotations

import math
from typing import Any

import torch

from .base import Hyper


class GroupValues:
    """Group `index` of `optimizer`'s `param_groups`, seen as the update kernels' `Hyper`. A key the group does not
    hold (SGD has no betas) answers the value it started with."""

    def __init__(self, optimizer: Any, index: int, start: Hyper) -> None:
        self._optimizer, self._index, self._start = optimizer, index, start

    def _group(self) -> dict:
        groups = handed_groups(self._optimizer)
        return groups[self._index] if self._index < len(groups) else {}

    def _read(self, key: str, fallback: float, lowest: float, below_one: bool = False) -> float:
        group = self._group()
        if key not in group:
            return fallback
        return _checked(group[key], f"optimizer.param_groups[{self._index}]['{key}']", lowest, below_one)

    def _beta(self, which: int) -> float:
        group = self._group()
        if "betas" not in group:
            return (self._start.beta1, self._start.beta2)[which]
        betas = group["betas"]
        try:
            if len(betas) != 2:
                raise ValueError("not a pair")
            return _checked(betas[which], "", 0.0, below_one=True)
        except (TypeError, ValueError):  # not a pair, or not numbers in range: one line naming the whole pair
            raise ValueError(f"optimizer.param_groups[{self._index}]['betas'] is {betas!r}; set a pair (beta1, "
                             "beta2) of finite numbers in [0, 1)") from None

    def _set_beta(self, which: int, value: float) -> None:
        """A schedule's betas (OneCycle's momentum cycling) go into the group, as DeepSpeed's scheduler writes them."""
        pair = [self.beta1, self.beta2]
        pair[which] = value
        group = self._group()
        if "betas" in group:
            group["betas"] = (pair[0], pair[1])
        else:
            self._start.beta1, self._start.beta2 = pair

    @property
    def beta1(self) -> float:
        return self._beta(0)

    @beta1.setter
    def beta1(self, value: float) -> None:
        self._set_beta(0, value)

    @property
    def beta2(self) -> float:
        return self._beta(1)

    @beta2.setter
    def beta2(self, value: float) -> None:
        self._set_beta(1, value)

    @property
    def eps(self) -> float:
        return self._read("eps", self._start.eps, 0.0)

    @property
    def weight_decay(self) -> float:
        return self._read("weight_decay", self._start.weight_decay, 0.0)


def handed_groups(optimizer: Any) -> list[dict]:
    """The handed-back optimizer's group list itself: vars(), without the refresh ZeroOptimizer's property may run
    (a host sync under fp16); empty where it has none."""
    groups = vars(optimizer).get("param_groups")
    return groups if isinstance(groups, list) else []


def finite_number(value: Any) -> float | None:
    """A group value as a float, if it is a finite number (a one-element tensor too: torch lets a group hold one)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = float(value)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _checked(value: Any, where: str, lowest: float, below_one: bool = False) -> float:
    """`value` as a float, if it is a finite number >= `lowest` (and < 1 where `below_one`), else one line."""
    number = finite_number(value)
    if number is None or number < lowest or (below_one and number >= 1.0):
        bound = f"in [{lowest:g}, 1)" if below_one else f">= {lowest:g}"
        raise ValueError(f"{where} is {value!r}; set a finite number {bound}")
    return number


def follow_group_values(engine: Any) -> None:
    """The engine's updates take each group's betas, eps and weight_decay from the optimizer `initialize` hands back
    (`engine.client_optimizer`), whose groups are the ones `engine.optimizer.param_groups` shows."""
    groups = engine.optimizer.groups
    groups[:] = [h if isinstance(h, GroupValues) else GroupValues(engine.client_optimizer, i, h)
                 for i, h in enumerate(groups)]
