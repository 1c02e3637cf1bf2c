"""The dtype each floating buffer runs in, decided as DeepSpeed 0.19.8 decides it.

A model built as usual keeps its buffers' own dtypes under fp16/bf16 (a rotary table's fp32 `inv_freq` stays
fp32); one built inside `zero_core.init_context` has them in the working precision (one built inside
`deepspeed.zero.Init` keeps the dtypes its construction gave them, as DeepSpeed's engine does: the engine passes
`built_deferred` False for it). `data_types.buffer_dtype` casts them all to the dtype it names. The
buffers `data_types.keep_in_fp32_modules` names stay in (or go up to) fp32 whatever else applies: "auto" takes
the model's own transformers lists (`_keep_in_fp32_modules_strict`, and `_keep_in_fp32_modules` under fp16), a
list gives name patterns (`*` any characters, matched anywhere in the buffer's full name), [] keeps none.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from .config_models import TORCH_DTYPES

def _pattern(model: torch.nn.Module, setting: Any, working: torch.dtype) -> re.Pattern[str] | None:
    """The names to keep in fp32, as one regular expression (None: none)."""
    if working not in (torch.float16, torch.bfloat16):
        return None
    if setting == "auto":
        found = []
        for prefix, module in model.named_modules():
            names = list(getattr(module, "_keep_in_fp32_modules_strict", None) or [])
            if working == torch.float16:
                names += list(getattr(module, "_keep_in_fp32_modules", None) or [])
            found += [(rf"^{re.escape(prefix)}\..*" if prefix else "") + n.replace("*", ".*") for n in names]
    else:
        found = [n.replace("*", ".*") for n in setting or []]
    return re.compile("|".join(sorted(set(found)))) if found else None


def buffer_targets(model: torch.nn.Module, cfg: Any, built_deferred: bool) -> dict[int, torch.dtype]:
    """id(buffer) -> the dtype it runs in, for each floating buffer of `model` (its own dtype where nothing applies)."""
    working = cfg.dtype
    types = cfg.data_types
    named = TORCH_DTYPES[types.buffer_dtype] if types is not None and types.buffer_dtype is not None else None
    keep = _pattern(model, types.keep_in_fp32_modules if types is not None else "auto", working)
    targets = {}
    for name, b in model.named_buffers():
        if b is None or not b.is_floating_point():
            continue
        if keep is not None and keep.search(name):
            targets[id(b)] = torch.float32
        else:
            targets[id(b)] = named or (working if built_deferred else b.dtype)
    return targets
