"""The two hot kernels of zero_core and their backend dispatch.

Backend, from the env var ``ZERO_CORE_KERNELS`` (read at every call, so tests can switch it):
  ``auto`` (default)  Triton when the tensor is on CUDA and triton imports; on the CPU, torch's fused
                      CPU Adam (``cpu.py``) where this torch has it, else the torch reference;
  ``torch``           always the torch reference;
  ``triton``          always Triton (on CPU only under ``TRITON_INTERPRET=1``).
Triton is imported lazily: ``import zero_core`` works without it, and TRITON_INTERPRET set by a test
before the first call is honoured.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from types import ModuleType

import torch
from torch import Tensor

from . import reference

__all__ = ["reduce_epilogue", "adamw_step", "backend_for"]

_BACKENDS = ("auto", "torch", "triton")
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


@functools.cache
def _triton_available() -> bool:
    if importlib.util.find_spec("triton") is None:
        return False
    try:
        import triton  # noqa: F401
    except Exception:  # a broken install (e.g. no compiler) must not break the CPU path
        return False
    return True


def backend_for(t: Tensor) -> str:
    """The backend (``"torch"``, ``"cpu"`` or ``"triton"``) that a call on tensor ``t`` would use now."""
    mode = os.environ.get("ZERO_CORE_KERNELS", "auto").strip().lower()
    if mode not in _BACKENDS:
        raise ValueError(f"ZERO_CORE_KERNELS={mode!r} is not one of {', '.join(_BACKENDS)}")
    if mode == "torch":
        return "torch"
    if mode == "auto":
        if t.is_cuda:
            return "triton" if _triton_available() else "torch"
        from . import cpu

        return "cpu" if t.device.type == "cpu" and cpu.available() else "torch"
    if not _triton_available():
        raise ValueError("ZERO_CORE_KERNELS=triton but triton cannot be imported")
    if not t.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            f"ZERO_CORE_KERNELS=triton on a {t.device.type} tensor needs TRITON_INTERPRET=1 "
            "(set before triton is imported); use ZERO_CORE_KERNELS=torch or auto instead"
        )
    return "triton"


def _impl(t: Tensor, name: str) -> ModuleType:
    backend = backend_for(t)
    if backend == "torch":
        return reference
    if backend == "cpu":
        from . import cpu

        return cpu
    if name == "epilogue":
        from . import triton_epilogue

        return triton_epilogue
    from . import triton_adamw

    return triton_adamw


def _check_flat(name: str, t: Tensor, like: Tensor, dtypes: tuple[torch.dtype, ...]) -> None:
    if (t.dim() != 1 or not t.is_contiguous() or t.numel() != like.numel() or t.dtype not in dtypes
            or t.device != like.device):
        raise ValueError(
            f"{name}: expected a 1-D contiguous tensor of {like.numel()} elements on {like.device} with "
            f"dtype in {dtypes}, got shape {tuple(t.shape)}, {t.dtype} on {t.device}, "
            f"contiguous={t.is_contiguous()}"
        )


def _check_scalar(name: str, t: Tensor, dtype: torch.dtype | tuple[torch.dtype, ...], device: torch.device) -> None:
    dtypes = dtype if isinstance(dtype, tuple) else (dtype,)
    if t.numel() != 1 or t.dtype not in dtypes or t.device != device:
        raise ValueError(f"{name}: expected a 1-element {' or '.join(map(str, dtypes))} tensor on {device}, got "
                         f"{t.dtype} with {t.numel()} elements on {t.device}")


def reduce_epilogue(
    reduced: Tensor, acc: Tensor, scale: Tensor, accumulate: bool, sumsq: Tensor, nonfinite: Tensor
) -> None:
    """After a reduce-scatter, in one pass over the data:

    ``acc = (acc if accumulate else 0) + reduced.float() * scale[0]`` in place (acc is fp32),
    ``sumsq[0] += sum(acc_new ** 2)`` (the squares summed in fp64, deterministic run to run; ``sumsq`` is fp64,
    or fp32), and ``nonfinite[0] = 1`` (int32) if any element of acc_new is inf/NaN; the flag is never reset here.

    ``reduced`` is 1-D contiguous fp32/bf16/fp16; ``scale``, ``sumsq``, ``nonfinite`` are 1-element
    tensors on the same device (read/written there: no host synchronisation).
    """
    _check_flat("acc", acc, acc, (torch.float32,))
    _check_flat("reduced", reduced, acc, _FLOATS)
    _check_scalar("scale", scale, torch.float32, acc.device)
    _check_scalar("sumsq", sumsq, (torch.float64, torch.float32), acc.device)
    _check_scalar("nonfinite", nonfinite, torch.int32, acc.device)
    _impl(acc, "epilogue").reduce_epilogue(reduced, acc, scale, accumulate, sumsq, nonfinite)


def adamw_step(
    param: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    out: Tensor | None,
    *,
    lr: Tensor,
    step: Tensor,
    coef: Tensor,
    skip: Tensor,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    decoupled: bool = True,
) -> None:
    """One fused fp32 AdamW (``decoupled=True``) or Adam+L2 (``decoupled=False``) update, in place.

    ``g = grad * coef[0]`` (grad itself is not modified); m, v and param are updated as
    torch.optim.AdamW / Adam do, with bias corrections from ``step[0]`` (the 1-based update count),
    and ``out`` (None, or a bf16/fp16/fp32 buffer) receives the new param cast to its dtype.
    If ``skip[0] != 0`` nothing at all is written. ``lr``, ``step``, ``coef`` (fp32) and ``skip``
    (int32) are 1-element device tensors, read on the device: no host synchronisation.
    """
    for name, t in (("param", param), ("grad", grad), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
        _check_flat(name, t, param, (torch.float32,))
    if out is not None:
        _check_flat("out", out, param, _FLOATS)
    for name, t in (("lr", lr), ("step", step), ("coef", coef)):
        _check_scalar(name, t, torch.float32, param.device)
    _check_scalar("skip", skip, torch.int32, param.device)
    _impl(param, "adamw").adamw_step(
        param, grad, exp_avg, exp_avg_sq, out, lr=lr, step=step, coef=coef, skip=skip,
        beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay, decoupled=decoupled,
    )
