"""torch.compile of a model's repeated blocks, identical for every engine.

Each block's `forward` is compiled, not the module call: the engines' module hooks (zero_core's stage-3
gathers, FSDP2's shard/unshard, the weight-gather waits) stay eager around the compiled code instead of
being traced into it, and the engines see the same modules and parameters as without compilation. One
compiled region per block keeps the backward granular enough for gradient reduction to overlap with it.
All blocks share one forward, so the graph is compiled once (and once more for evaluation).
"""

from __future__ import annotations

from typing import Any

import torch

from zero_core import ConfigError


def compile_blocks(bundle: Any, backend: str) -> int:
    """Compile every block of `bundle` with `backend`; returns how many blocks were wrapped."""
    if not bundle.blocks:
        raise ConfigError("compile: this model has no repeated blocks to compile (no ModuleList of layers found); "
                          "remove the compile key")
    for block in bundle.blocks:
        block.forward = torch.compile(block.forward, backend=backend)
    return len(bundle.blocks)


def graphs_compiled() -> int:
    """Graphs dynamo has compiled in this process so far (0: nothing went through torch.compile)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
