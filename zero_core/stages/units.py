"""Which parameters travel together: units of one transformer block each, and a root unit for the rest.

Stage 3 gathers and releases parameters unit by unit; stages 1-2 use the same units to decide which
weight all-gathers a module's forward must wait for. A unit is each child of an `nn.ModuleList` (a
transformer block) with its whole subtree, plus one root unit for every parameter outside the blocks.
"""

from __future__ import annotations

import torch

from checkpoints.layout import FlatLayout


def block_units(model: torch.nn.Module, trainable: set[int]) -> tuple[list[torch.nn.Parameter], list[int], list]:
    """Order parameters by unit. Each child of an nn.ModuleList (a transformer block) is one unit with its
    whole subtree (a child that is itself a ModuleList or ModuleDict, as in `for attn, ff in self.layers`,
    is never called: its own children are the units), and every parameter outside the blocks (embeddings,
    final norm, a tied head, relative position tables read by a parent) forms one root unit, gathered for the
    whole forward and backward, as FSDP2 wraps the root. A model without blocks gets one unit per module that
    owns parameters.

    Block-sized units keep all-gathers and reduce-scatters large; the root unit covers parameters that
    a module reads without calling the module that holds them. A unit that reuses a parameter owned by
    another (tied embeddings) needs that unit gathered too.
    """
    owner: dict[int, int] = {}
    ordered: list[torch.nn.Parameter] = []
    bounds: list[int] = []
    units: list[tuple[torch.nn.Module, tuple[int, ...]]] = []

    def add_unit(module: torch.nn.Module, params: list[torch.nn.Parameter]) -> None:
        params = [p for p in dict.fromkeys(params) if id(p) in trainable]
        own = [p for p in params if id(p) not in owner]
        if own:
            bounds.append(len(ordered))
            for p in own:
                owner[id(p)] = len(bounds) - 1
                ordered.append(p)
        needed = tuple(dict.fromkeys(owner[id(p)] for p in params))
        if needed:
            units.append((module, needed))

    blocks: list[torch.nn.Module] = []
    outside: list[torch.nn.Module] = []

    def split(module: torch.nn.Module, is_block: bool) -> None:
        if is_block and isinstance(module, (torch.nn.ModuleList, torch.nn.ModuleDict)):
            for child in module.children():  # a container is never called: its children are the blocks
                split(child, True)
            return
        if is_block and not isinstance(module, (torch.nn.ParameterList, torch.nn.ParameterDict)):
            blocks.append(module)  # (parameter containers are read, not called: they join the root unit)
            return
        outside.append(module)
        for child in module.children():
            split(child, isinstance(module, torch.nn.ModuleList))

    split(model, False)
    direct = [[p for p in m._parameters.values() if p is not None] for m in outside]
    if blocks:
        add_unit(model, [p for ps in direct for p in ps])
        for block in blocks:
            add_unit(block, list(block.parameters()))
    else:
        for module, ps in zip(outside, direct):
            add_unit(module, ps)
    return ordered, bounds, units


def units_as_buckets(
    units: list,
    unit_params: list[torch.nn.Parameter],
    bounds: list[int],
    params: list[torch.nn.Parameter],
    layout: FlatLayout,
) -> list[tuple[torch.nn.Module, list[int]]]:
    """Stage-3 units (module, unit indices it reads; the root unit first) re-expressed as the stage 1-2
    buckets they read. `unit_params` is in unit order, `params` in layout order."""
    index = {id(p): i for i, p in enumerate(params)}
    ends = bounds[1:] + [len(unit_params)]
    buckets_of_unit = [
        sorted({layout.slots[index[id(p)]].group for p in unit_params[lo:hi]}) for lo, hi in zip(bounds, ends)
    ]
    return [(module, sorted({b for u in needed for b in buckets_of_unit[u]})) for module, needed in units]
