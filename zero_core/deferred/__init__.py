"""Sharded initialisation: build a model without holding it, then give each rank only its shard.

record.py       `init_context`'s recorder: the model on the meta device, its construction logged
replay.py       the log computed again on the CPU, one tensor version alive at a time
materialise.py  each parameter's value handed to the engine (which keeps this rank's shard), buffers placed
factory_dtype.py, construction_end.py  deepspeed.zero.Init's dtype in the recording
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from .materialise import is_deferred, materialiser, placeholder, remember
from .factory_dtype import built_converted, mark_converted
from .record import Recorder

__all__ = ["built_converted", "init_context", "is_deferred", "materialiser", "placeholder", "stage_of"]


def stage_of(config: Any) -> int:
    """The ZeRO stage `config` asks for (a dict, a JSON path or a ZeroConfig), without resolving batch sizes."""
    from ..config import ZeroConfig, load_config
    from ..config_file import config_data

    if isinstance(config, ZeroConfig):
        return config.stage
    config = config_data(config)  # initialize's reader: no FIFO wait, no duplicate keys
    if not isinstance(config, dict):
        raise ValueError(
            f"the config must be a DeepSpeed config (a dict, a JSON path or a ZeroConfig), not "
            f"{type(config).__name__}; pass one of those"
        )
    zero = config.get("zero_optimization") or {}
    stage = zero.get("stage", 0) if isinstance(zero, dict) else 0
    if stage not in (0, 1, 2, 3):
        load_config(config, 1)  # raises the config's own one-line error
    return int(stage)


@contextlib.contextmanager
def init_context(config: Any = None, enabled: bool = True, *, dtype: Any = None) -> Iterator[None]:
    """Build the model inside this context to initialise it sharded: every tensor made here lives on the
    meta device (no memory) and its construction is recorded. `zero_core.initialize` then computes each
    parameter once, in construction order, on the CPU, and keeps only this rank's shard, so the weights equal
    eager construction's with the same seed, bitwise, at any world size, whatever precision `config` trains
    in (under fp16/bf16 the fp32 master weights start from those fp32 values).

    `dtype` (None by default) is for `deepspeed.zero.Init`: the torch factories DeepSpeed's zero.Init converts
    make floating tensors of that dtype, and each finished module's parameters take it (factory_dtype.py), so
    construction runs in it as under DeepSpeed (bf16 weights drawn in bf16, masters starting from them) and is
    no longer eager construction's.

    With a `config` whose stage is below 3 (or `enabled=False`) the model is built normally: stages 0-2
    hold every weight on every rank anyway."""
    if not enabled or (config is not None and stage_of(config) != 3):
        yield
        return
    recorder = Recorder(dtype)
    with recorder:
        yield
    remember(recorder.recording)
    if dtype is not None:  # their buffers keep the dtypes construction gave them (factory_dtype.py)
        mark_converted(m for m in (ref() for ref in recorder.recording.modules.values()) if m is not None)
