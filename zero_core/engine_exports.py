"""The engine's whole weights as DeepSpeed's engine hands them out: `save_16bit_model`, `module_state_dict` and
`_zero3_consolidated_16bit_state_dict` (which Accelerate's `get_state_dict` and Hugging Face's saving call at
ZeRO-3). Each is collective: every rank must call it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from .model_export import save_model_weights


class WeightExports:
    module: Any
    stage: int
    rank: int
    full_state_dict: Any

    def save_16bit_model(self, save_dir: str | os.PathLike, save_filename: str = "pytorch_model.bin",
                         exclude_frozen_parameters: bool = False) -> bool:
        """Collective: the current weights in the working precision in `save_dir/save_filename`, at every stage
        (gathered from the fp32 masters), plus `config.json` when the module has a Hugging Face config. As
        DeepSpeed's, by default `pytorch_model.bin` (a torch.save of plain tensors); a `*.safetensors` name writes
        safetensors, tied weights once under their first name, as `save_pretrained` does."""
        save_model_weights(self, Path(save_dir), save_filename, exclude_frozen_parameters)
        return True

    save_fp16_model = save_16bit_model

    def module_state_dict(self) -> dict[str, torch.Tensor]:
        """The current weights, full, on every rank (collective): `full_state_dict` cast to their training dtypes;
        a weight tied under several names stays one tensor, as in the module's own state_dict."""
        entries = self.module.state_dict(keep_vars=True)
        full, cast = self.full_state_dict(), {}
        for name, value in entries.items():
            if name in full and isinstance(value, torch.Tensor) and id(value) not in cast:
                cast[id(value)] = full[name].to(value.dtype)
        return {n: cast[id(v)] for n, v in entries.items() if id(v) in cast}

    def _zero3_consolidated_16bit_state_dict(self, exclude_frozen_parameters: bool = False) -> dict | None:
        """Collective, ZeRO-3 only, as DeepSpeed's: the whole weights in their training dtypes on CPU on rank 0
        (persistent buffers too; tied weights one tensor), None on the other ranks."""
        if self.stage != 3:
            raise ValueError(f"_zero3_consolidated_16bit_state_dict needs ZeRO stage 3 (this engine is at stage "
                             f"{self.stage}), as DeepSpeed's does; call engine.module_state_dict() instead")
        state = self.module_state_dict()
        if exclude_frozen_parameters:
            frozen = {n for n, p in self.module.named_parameters() if not p.requires_grad}
            state = {n: t for n, t in state.items() if n not in frozen}
        return state if self.rank == 0 else None
