"""The tensor dtypes checkpoints hold, in one table: safetensors' codes, torch's dtypes and the names manifests
use (torch's without "torch."). Every dtype safetensors can store is here, complex64 (rotary tables such as
`freqs_cis`) and the unsigned and 8-bit float types included; what it cannot store (complex128, ...) is refused by
`code_of` in one line."""

from __future__ import annotations

import torch

from .source import CheckpointError

SAFETENSORS: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "C64": torch.complex64,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U64": torch.uint64,
    "U32": torch.uint32,
    "U16": torch.uint16,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
_CODE = {dtype: code for code, dtype in SAFETENSORS.items()}


def name_of(dtype: torch.dtype) -> str:
    """The manifest's name of a dtype: "float32", "complex64", ..."""
    return str(dtype).removeprefix("torch.")


ITEM_BYTES: dict[str, int] = {code: dtype.itemsize for code, dtype in SAFETENSORS.items()}  # per safetensors code
NAMES: dict[str, int] = {name_of(dtype): dtype.itemsize for dtype in SAFETENSORS.values()}  # manifest name -> bytes
NAME_OF_CODE: dict[str, str] = {code: name_of(dtype) for code, dtype in SAFETENSORS.items()}
FLOAT_NAMES = {name_of(d) for d in SAFETENSORS.values() if d.is_floating_point and d.itemsize >= 2}  # trainable
TRAINING_NAMES = ("float32", "bfloat16", "float16")  # the precisions a run trains in (a manifest's `dtype`)


def code_of(dtype: torch.dtype, name: str = "") -> str:
    """safetensors' code for `dtype`, or one line naming the tensor that cannot be stored."""
    code = _CODE.get(dtype)
    if code is None:
        what = f"tensor {name!r}" if name else "a tensor"
        raise CheckpointError(f"{what} has dtype {name_of(dtype)}, which safetensors cannot store; keep it as "
                              "one it can (complex64, float64 and smaller floats, the integer types)")
    return code
