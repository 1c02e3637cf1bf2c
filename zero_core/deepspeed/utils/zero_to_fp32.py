"""`deepspeed.utils.zero_to_fp32`'s functions, reading any checkpoint `zbench convert` reads (zbench's own,
DeepSpeed ZeRO 1-3 and universal, DCP) with its readers (checkpoints/): nothing in the files is unpickled
beyond plain data, and every problem is one CheckpointError line.

    state = get_fp32_state_dict_from_zero_checkpoint("ckpt")                  # {name: fp32 tensor}
    model = load_state_dict_from_zero_checkpoint(model, "ckpt")               # into the model, on the CPU
    convert_zero_checkpoint_to_fp32_state_dict("ckpt", "out")                 # out/pytorch_model.bin, as DeepSpeed
    convert_zero_checkpoint_to_fp32_state_dict("ckpt", "out", safe_serialization=True)  # out/model.safetensors
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from checkpoints.consolidate import parse_size, write_consolidated
from checkpoints.detect import open_source
from checkpoints.source import CheckpointError, full_state_dict

from .zero_to_fp32_bin import write_pytorch_bins


def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir: str | os.PathLike, tag: str | None = None,
                                             exclude_frozen_parameters: bool = False,
                                             lazy_mode: bool = False) -> dict[str, torch.Tensor]:
    """Every entry of the model's state dict, full and fp32 on the CPU (tied names share one tensor).
    `checkpoint_dir` is the checkpoint or its parent with `latest`; `tag` picks a sub-folder."""
    if lazy_mode:
        raise CheckpointError("lazy_mode=True is not supported by zero_core; read the whole state dict (or use "
                              "`zbench convert`, which streams it to safetensors with bounded memory)")
    return full_state_dict(open_source(checkpoint_dir, tag), trainable_only=exclude_frozen_parameters)


def load_state_dict_from_zero_checkpoint(model: torch.nn.Module, checkpoint_dir: str | os.PathLike,
                                         tag: str | None = None) -> torch.nn.Module:
    """The checkpoint's fp32 weights loaded into `model`, moved to the CPU first (as DeepSpeed does); returns it."""
    state = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag)
    model = model.cpu()
    model.load_state_dict(state, strict=False)
    return model


def convert_zero_checkpoint_to_fp32_state_dict(checkpoint_dir: str | os.PathLike, output_dir: str | os.PathLike,
                                               max_shard_size: str | int = "5GB", safe_serialization: bool = False,
                                               tag: str | None = None,
                                               exclude_frozen_parameters: bool = False) -> list[Path]:
    """The fp32 weights in `output_dir`, new or empty, as DeepSpeed writes them: by default `pytorch_model.bin`
    (a torch.save of plain tensors), with `safe_serialization=True` `model.safetensors`; sharded past
    `max_shard_size`, with an index. Returns the files written (DeepSpeed's returns None)."""
    if exclude_frozen_parameters:
        raise CheckpointError("exclude_frozen_parameters=True is not supported here; write every weight, or use "
                              "get_fp32_state_dict_from_zero_checkpoint(..., exclude_frozen_parameters=True)")
    source = open_source(checkpoint_dir, tag)
    if not safe_serialization:
        return write_pytorch_bins(source, Path(output_dir), parse_size(max_shard_size))
    return write_consolidated(source, output_dir, torch.float32, parse_size(max_shard_size), progress=False,
                              out_name="output_dir")
