"""The step's global gradient norm and clip coefficient, in the arithmetic of DeepSpeed 0.19.8's stage.

Every rank's sum of squares is taken in fp64 (the reduce epilogue, kernels/). From there DeepSpeed's stages
part ways, and the engine follows the stage it runs:

- stages 1-2 round each rank's sum to fp32 before the all-reduce, and take the root, the ratio
  r = (norm + 1e-6) / clip and the multiplier 1 / max(1, r) in fp32;
- stage 3 keeps the all-reduce, the root, the ratio and the multiplier in fp64 (its get_global_grad_norm()
  is an fp64 tensor), and the multiplier becomes fp32 only where it scales the fp32 gradient;
- stage 0 has no ZeRO optimizer; DeepSpeed's engine clips a plain optimizer's gradients by min(1, clip / (norm +
  1e-6)) in fp32 (its bf16 wrapper takes 1 / max(1, (norm + 1e-6) / clip) in Python floats instead, from fp32
  norms of each parameter: within an ulp of this, not matched bit for bit).

The multipliers differ by about an fp32 ulp. That is enough: the gradient scaled by one or the other puts some
fp32 master weights an ulp apart, and a few of those round to the neighbouring bf16 weight, so the next forward
and everything after it differ from DeepSpeed's (about 1e-4 in the loss of a small model).
"""

from __future__ import annotations

import torch


def norm_dtype(stage: int) -> torch.dtype:
    """The dtype of the global sum of squares, its all-reduce and the norm at this ZeRO stage."""
    return torch.float64 if stage == 3 else torch.float32


def clip_coefficient(norm: torch.Tensor, clip: float, stage: int) -> torch.Tensor:
    """The fp32 multiplier of the gradients for a global `norm` (in `norm_dtype(stage)`) and `clip` > 0."""
    if stage == 0:  # a tensor division (`clip / tensor` would multiply by a rounded reciprocal)
        return (torch.full_like(norm, clip) / (norm + 1e-6)).clamp(max=1.0).to(torch.float32)
    ratio = ((norm + 1e-6) / clip).clamp(min=1.0)
    return (1.0 / ratio).to(torch.float32)
