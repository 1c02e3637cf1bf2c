"""`deepspeed.utils.zero_to_fp32`'s functions, reading any checkpoint `zbench convert` reads (zbench's own,
DeepSpeed ZeRO 1-3 and universal, DCP) with its readers (checkpoints/): nothing in the files is unpickled
beyond plain data, and every problem is one CheckpointError line. Each file's checksum (zbench) or zip CRCs
(DeepSpeed, DCP) are checked before a weight is returned or written, as `zbench convert` checks them: a damaged
file is named, never converted into wrong weights (DeepSpeed's own verifies nothing).

    state = get_fp32_state_dict_from_zero_checkpoint("ckpt")                  # {name: fp32 tensor}
    model = load_state_dict_from_zero_checkpoint(model, "ckpt")               # into the model, on the CPU
    convert_zero_checkpoint_to_fp32_state_dict("ckpt", "out")                 # out/pytorch_model.bin, as DeepSpeed
    convert_zero_checkpoint_to_fp32_state_dict("ckpt", "out", safe_serialization=True)  # out/model.safetensors
    convert_zero_checkpoint_to_state_dict("ckpt", "out", dtype=torch.bfloat16)          # floating weights in bf16
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from checkpoints.consolidate import first_problem, parse_size, write_consolidated
from checkpoints.detect import open_source
from checkpoints.source import CheckpointError, CheckpointSource, ParamInfo, full_state_dict

from .zero_to_fp32_bin import write_pytorch_bins

# the output dtypes DeepSpeed's convert_zero_checkpoint_to_state_dict takes, by name (any case, "torch." allowed)
_DTYPE_NAMES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
                "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir: str | os.PathLike, tag: str | None = None,
                                             exclude_frozen_parameters: bool = False,
                                             lazy_mode: bool = False) -> dict[str, torch.Tensor]:
    """Every entry of the model's state dict, full and fp32 on the CPU (tied names share one tensor).
    `checkpoint_dir` is the checkpoint or its parent with `latest`; `tag` picks a sub-folder."""
    if lazy_mode:
        raise CheckpointError("lazy_mode=True is not supported by zero_core; read the whole state dict (or use "
                              "`zbench convert`, which streams it to safetensors with bounded memory)")
    source = _verified(open_source(checkpoint_dir, tag))
    return full_state_dict(_WithoutFrozen(source) if exclude_frozen_parameters else source)


def load_state_dict_from_zero_checkpoint(model: torch.nn.Module, checkpoint_dir: str | os.PathLike,
                                         tag: str | None = None) -> torch.nn.Module:
    """The checkpoint's fp32 weights loaded into `model`, moved to the CPU first (as DeepSpeed does); returns it."""
    state = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag)
    model = model.cpu()
    model.load_state_dict(state, strict=False)
    return model


def convert_zero_checkpoint_to_state_dict(checkpoint_dir: str | os.PathLike, output_dir: str | os.PathLike,
                                          dtype: torch.dtype | str = torch.float32,
                                          max_shard_size: str | int | None = "5GB", safe_serialization: bool = False,
                                          tag: str | None = None,
                                          exclude_frozen_parameters: bool = False) -> list[Path]:
    """The weights in `output_dir` as DeepSpeed writes them: by default `pytorch_model.bin` (a torch.save of plain
    tensors), with `safe_serialization=True` `model.safetensors`; sharded past `max_shard_size` (None: one file),
    with an index. Floating-point entries in `dtype` (float32, float16 or bfloat16, or their names), others as
    saved. `output_dir` must be new or empty. Returns the files written (DeepSpeed's returns None)."""
    dtype = output_dtype(dtype)
    limit = sys.maxsize if max_shard_size is None else parse_size(max_shard_size)
    source: CheckpointSource = open_source(checkpoint_dir, tag)
    if exclude_frozen_parameters:
        source = _WithoutFrozen(source)
    if safe_serialization:  # checked in the same pass as the conversion, as `zbench convert` does
        return write_consolidated(source, output_dir, dtype, limit, progress=False, out_name="output_dir", verify=True)
    return write_pytorch_bins(_verified(source), Path(output_dir), limit, dtype)


def convert_zero_checkpoint_to_fp32_state_dict(checkpoint_dir: str | os.PathLike, output_dir: str | os.PathLike,
                                               max_shard_size: str | int | None = "5GB",
                                               safe_serialization: bool = False, tag: str | None = None,
                                               exclude_frozen_parameters: bool = False) -> list[Path]:
    """`convert_zero_checkpoint_to_state_dict` in fp32 (DeepSpeed's older name and argument order)."""
    return convert_zero_checkpoint_to_state_dict(checkpoint_dir, output_dir, torch.float32, max_shard_size,
                                                 safe_serialization, tag, exclude_frozen_parameters)


def _verified(source: CheckpointSource) -> CheckpointSource:
    """`source`, once every file it reads matched its checksum or CRCs; else one CheckpointError naming the file."""
    problems = source.verify()
    if problems:
        raise CheckpointError(first_problem(problems))
    return source


def output_dtype(dtype: Any) -> torch.dtype:
    """float32, float16 or bfloat16, given as a torch dtype or by name; else one ValueError line."""
    resolved = dtype
    if isinstance(dtype, str):
        resolved = _DTYPE_NAMES.get(dtype.removeprefix("torch.").lower())
    if resolved not in _DTYPE_NAMES.values():
        raise ValueError(f"output dtype {dtype!r} is not supported; pass one of {', '.join(_DTYPE_NAMES)}")
    return resolved


@dataclass
class _WithoutFrozen:
    """A checkpoint source without its frozen parameters (`exclude_frozen_parameters`): its trainable parameters
    and the buffers it names (a zbench manifest's `buffers`, a DeepSpeed checkpoint's `buffer_names`), as
    DeepSpeed keeps those. Where the format does not tell buffers from frozen parameters (a zbench checkpoint of
    an older version, DCP), both are left out. Everything else is the source's own."""

    source: Any

    def params(self) -> list[ParamInfo]:
        buffers = getattr(self.source, "buffer_names", None)
        if buffers is None:
            buffers = getattr(getattr(self.source, "model", None), "buffers", None)
        return [info for info in self.source.params() if info.trainable or info.name in (buffers or ())]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)
