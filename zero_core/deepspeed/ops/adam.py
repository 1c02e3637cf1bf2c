"""`deepspeed.ops.adam.FusedAdam` and `DeepSpeedCPUAdam` as a script builds them: each returns the torch AdamW
(or, with AdamW mode off, Adam with L2 decay) of the same hyper-parameters, which initialize runs on zero_core's
fused kernels, on the GPU or, with optimizer offload, on the host. What those kernels do not compute is refused
in one line."""

from __future__ import annotations

from typing import Any

import torch


def _adam(name: str, params: Any, lr: float, bias_correction: bool, betas: tuple[float, float], eps: float,
          weight_decay: float, amsgrad: bool, adamw_mode: bool) -> torch.optim.Optimizer:
    if amsgrad:
        raise ValueError(f"{name}(amsgrad=True) is not supported by zero_core (DeepSpeed refuses it too); drop it")
    if not bias_correction:
        raise ValueError(f"{name}(bias_correction=False) is not supported by zero_core's Adam kernels; drop it")
    kind = torch.optim.AdamW if adamw_mode else torch.optim.Adam
    return kind(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


def FusedAdam(params: Any, lr: float = 1e-3, bias_correction: bool = True, betas: tuple[float, float] = (0.9, 0.999),
              eps: float = 1e-8, adam_w_mode: bool = True, weight_decay: float = 0.0, amsgrad: bool = False,
              set_grad_none: bool = True) -> torch.optim.Optimizer:
    return _adam("FusedAdam", params, lr, bias_correction, betas, eps, weight_decay, amsgrad, adam_w_mode)


def DeepSpeedCPUAdam(model_params: Any, lr: float = 1e-3, bias_correction: bool = True,
                     betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                     amsgrad: bool = False, adamw_mode: bool = True, fp32_optimizer_states: bool = True
                     ) -> torch.optim.Optimizer:
    return _adam("DeepSpeedCPUAdam", model_params, lr, bias_correction, betas, eps, weight_decay, amsgrad, adamw_mode)
