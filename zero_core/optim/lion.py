"""Lion ("Symbolic Discovery of Optimization Algorithms", Chen et al. 2023) with the update rule and defaults of
DeepSpeed 0.19.8's FusedLion and DeepSpeedCPULion, for each element, with its gradient g and momentum m:

    c = beta1 * m + (1 - beta1) * g
    p = p * (1 - lr * weight_decay) - lr * sign(c)
    m = beta2 * m + (1 - beta2) * g

Defaults: lr 1e-3, betas (0.9, 0.999), weight_decay 0. The momentum is the state `exp_avg`, as DeepSpeed names it.
Where c is exactly 0 the element only decays (sign(0) = 0, the paper's rule). DeepSpeed's kernels step such an
element by lr all the same (upwards on the GPU), which would move the zero padding of zero_core's flat shards.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable

import torch


class Lion(torch.optim.Optimizer):
    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 weight_decay: float = 0.0, set_grad_none: bool = True) -> None:
        """`set_grad_none` is taken as DeepSpeed's FusedLion takes it; zero_grad() always sets gradients to None."""
        if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr >= 0):
            raise ValueError(f"Lion: lr must be a finite number >= 0, got {lr!r}")
        if not (isinstance(betas, (list, tuple)) and len(betas) == 2 and all(0 <= b < 1 for b in betas)):
            raise ValueError(f"Lion: betas must be two numbers in [0, 1), got {betas!r}")
        if not (isinstance(weight_decay, (int, float)) and math.isfinite(weight_decay) and weight_decay >= 0):
            raise ValueError(f"Lion: weight_decay must be a finite number >= 0, got {weight_decay!r}")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, decay = float(group["lr"]), float(group["weight_decay"])
            beta1, beta2 = (float(b) for b in group["betas"])
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "exp_avg" not in state:
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                momentum, grad = state["exp_avg"], p.grad
                direction = (momentum * beta1).add_(grad, alpha=1 - beta1).sign_()
                if decay:
                    p.mul_(1 - lr * decay)
                p.add_(direction, alpha=-lr)
                momentum.mul_(beta2).add_(grad, alpha=1 - beta2)
        return loss
