"""DeepSpeed's model-state memory estimators (`estimate_zero2/3_model_states_mem_needs*`), answered with
zero_core/memory_estimate.py's formulas: the `_all_live` forms count a model's parameters (tied ones once) and its
largest layer (the most parameters one module holds itself), the `_all_cold` forms take the counts; both print the
table `zbench estimate` prints for that stage, NVMe rows included."""

from __future__ import annotations

import torch

from .... import memory_estimate as est


def model_counts(model: torch.nn.Module) -> tuple[int, int]:
    """(total parameters, each counted once; the most parameters one module holds itself)."""
    total = sum({id(p): p.numel() for p in model.parameters()}.values())
    largest = max((sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()), default=0)
    return total, largest


def print_table(stages: tuple[int, ...], total: int, largest: int, gpus_per_node: int, nodes: int,
                buffer_factor: float) -> None:
    for name, value in (("num_gpus_per_node", gpus_per_node), ("num_nodes", nodes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    rows = [r for r in est.estimate(total, largest, gpus_per_node, nodes, buffer_factor) if r.stage in stages]
    print(est.format_table(rows, total, largest, gpus_per_node, nodes))
