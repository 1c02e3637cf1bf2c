"""The client_state engine.load_checkpoint returns, shaped as DeepSpeed 0.19.8's.

DeepSpeed's load returns the whole model-states dict it read, less `module` and the entries its engine took: the
counters (`skipped_steps`, `global_steps`, `dp_world_size`, `mp_world_size`) and `data_sampler` / `random_ltd`
unless `load_module_only`, `lr_scheduler` with `load_lr_scheduler_states`, `optimizer` with
`load_optimizer_states`. What is left is its own bookkeeping (`buffer_names`, `param_shapes`, `global_samples`,
`ds_config`, `ds_version`, ...) followed by the keys the script saved; a script's key of the same name as one of
its own replaced that entry at save.

A DeepSpeed checkpoint's entries come from its file (this rank's at ZeRO-3, as DeepSpeed reads it). A zbench
checkpoint has no such file: the entries are rebuilt from its manifest and from this engine, which the load
checked holds the same model, in the types DeepSpeed writes (torch.Size shapes in OrderedDicts, CPU tensors).
"""

from __future__ import annotations

import copy
import math
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from checkpoints.deepspeed_model_states import ModelStates, _materialized
from checkpoints.source import CheckpointError

if TYPE_CHECKING:
    from .engine import Engine

# what DeepSpeed's load takes into its engine (and so leaves out of what it returns) besides `module`
_COUNTERS = ("skipped_steps", "global_steps", "dp_world_size", "mp_world_size", "data_sampler", "random_ltd")


class LoadFlags(NamedTuple):
    """load_checkpoint's arguments that decide which entries come back, and how closely the model must match."""

    optimizer: bool = True  # load_optimizer_states
    scheduler: bool = True  # load_lr_scheduler_states
    module_only: bool = False  # load_module_only
    deepspeed: bool = False  # DeepSpeed's entries too (deepspeed.initialize's engines), else the saved keys alone
    strict: bool = True  # load_module_strict (checkpoint_non_strict.py)


def returned(entries: dict[str, Any], flags: LoadFlags) -> dict[str, Any]:
    """`entries` (a checkpoint's, `module` included or not) less those the engine took, in their order."""
    taken = {"module", *(() if flags.module_only else _COUNTERS)}
    taken |= {"lr_scheduler"} if flags.scheduler else set()
    taken |= {"optimizer"} if flags.optimizer else set()
    return {k: v for k, v in entries.items() if k not in taken}


def deepspeed_file_entries(model: ModelStates, rank: int, universal: bool) -> dict[str, Any]:
    """Every entry of the model-states file DeepSpeed's load on `rank` reads (ZeRO-3: each rank its own; a
    universal checkpoint's: rank 0's), but `module`, its tensors read from the file and CRC-checked."""
    path = model.paths[rank] if model.zero3 and not universal and rank < len(model.paths) else model.paths[0]
    state = model.files.get(path)
    client = model.client_state if path == model.paths[0] else {}  # the run's own keys, already read from it
    done: dict[int, Any] = {}
    read = _materialized(model.files, path, {k: v for k, v in state.items() if k != "module" and k not in client},
                         done)
    if any(isinstance(v, torch.Tensor) for v in done.values()):
        problems = model.files.file_problems(path)
        if problems:
            raise CheckpointError(f"{problems[0]}; copy the file again from the run that saved it")
    return {k: client[k] if k in client else read[k] for k in state if k != "module"}


def _names(module: torch.nn.Module) -> dict[int, str]:
    """Each parameter's name, the first of a tied one's (DeepSpeed names parameters as named_parameters does)."""
    return {id(p): name for name, p in reversed(list(module.named_parameters()))}


def _walk(module: torch.nn.Module, prefix: str = ""):
    """(prefix, module) for `module` and each child, parents first: DeepSpeed's walk, which, unlike
    named_modules, visits a module reachable by two paths under both."""
    yield prefix, module
    for name, child in module.named_children():
        yield from _walk(child, f"{prefix}{name}.")


def _buffer_names(module: torch.nn.Module) -> list[str]:
    return [prefix + name for prefix, m in _walk(module) for name, b in m.named_buffers(recurse=False)
            if b is not None and name not in m._non_persistent_buffers_set]


def _shared_params(module: torch.nn.Module) -> dict[str, str]:
    """{name: first name} of each parameter reached again under another name. DeepSpeed tells them apart by
    storage address (ZeRO-3: by id); zero_core by the parameter object, which is what ties them."""
    owner: dict[int, str] = {}
    shared: dict[str, str] = {}
    for prefix, m in _walk(module):
        for name, p in m.named_parameters(recurse=False):
            if p is not None and id(p) in owner:
                shared[prefix + name] = owner[id(p)]
            elif p is not None:
                owner[id(p)] = prefix + name
    return shared


class _Params:
    """The engine's parameters as DeepSpeed's checkpoint names them: full shapes (a ZeRO-3 parameter's module
    tensor may be released; its layout slot keeps the shape)."""

    def __init__(self, engine: "Engine") -> None:
        self.engine = engine
        slots = engine.layout.slots
        self.shape_of = {id(p): torch.Size(slots[i].shape) for i, p in enumerate(engine.params)}
        self.name_of = _names(engine.module)

    def shape(self, p: torch.nn.Parameter) -> torch.Size:
        return self.shape_of.get(id(p), p.shape)

    def optimized(self, p: torch.nn.Parameter) -> bool:
        """DeepSpeed's rule: trainable and not empty (an empty one is saved with the frozen ones)."""
        return p.requires_grad and math.prod(self.shape(p)) > 0

    def group_shapes(self) -> list[OrderedDict]:
        """One {name: shape} per optimizer group, in its order; ZeRO-3 splits a group into sub-groups of about
        sub_group_size partition elements, as DeepSpeed's stage 3 does, and has none for an empty group."""
        e, out = self.engine, []
        limit = e.config.zero_optimization.sub_group_size if e.stage == 3 else None
        for group in e.client_optimizer.param_groups:
            params = [p for p in group["params"] if self.optimized(p)]
            if e.stage == 3 and not params:
                continue
            parts = [math.ceil(math.prod(self.shape(p)) / e.world_size) for p in params]
            cuts = [len(params)] if limit is None or limit >= sum(parts) else _cuts(parts, limit)
            for lo, hi in zip([0, *cuts[:-1]], cuts):
                out.append(OrderedDict((self.name_of[id(p)], self.shape(p)) for p in params[lo:hi]))
        return out

    def frozen(self) -> list[tuple[str, torch.nn.Parameter]]:
        return [(self.name_of[id(p)], p) for p in self.engine.module.parameters() if not self.optimized(p)]

    def fragment(self, p: torch.nn.Parameter) -> torch.Tensor:
        """A frozen parameter as DeepSpeed saves it: whole, or at ZeRO-3 this rank's slice of it flattened
        (ceil(numel / ranks) elements, the last rank's padded; zeros here); a CPU copy of its own."""
        e = self.engine
        if e.stage != 3:
            return p.detach().to("cpu", copy=True)
        part = math.ceil(p.numel() / e.world_size)
        rank = e.rank if e.world_size > 1 else 0
        out = torch.zeros(part, dtype=p.dtype)
        mine = p.detach().reshape(-1)[rank * part : (rank + 1) * part]
        out[: mine.numel()].copy_(mine)
        return out


def _cuts(parts: list[int], limit: int) -> list[int]:
    """Where DeepSpeed's stage 3 closes its sub-groups: once one holds `limit` elements, and at the end."""
    cuts, held = [], 0
    for i, n in enumerate(parts):
        held += n
        if held >= limit or i == len(parts) - 1:
            cuts.append(i + 1)
            held = 0
    return cuts


def _scheduler_entry(engine: "Engine", saved: Any) -> Any:
    """DeepSpeed saves its scheduler's state_dict, None without one; the manifest records the config schedule's
    ({"last_batch_iteration": n}, the same) or a passed torch scheduler's inside {"scheduler": ..., "stepped": n}
    (its tuples become lists in JSON)."""
    if engine.lr_scheduler is None:
        return None
    inner = saved.get("scheduler") if isinstance(saved, dict) and "stepped" in saved else saved
    return copy.deepcopy(inner)


def zbench_entries(engine: "Engine", manifest: dict[str, Any]) -> dict[str, Any]:
    """What DeepSpeed's save of this run would hold but `module`, from this engine after it loaded the checkpoint
    of `manifest`, followed by the manifest's client_state. Not rebuilt: stage 0's `optimizer`, DeepSpeed's own
    torch optimizer's state_dict, a format this engine's optimizer does not have (its states are loaded into it)."""
    from .deepspeed import __version__

    e, zero = engine, engine.stage > 0
    params = _Params(e)
    # DeepSpeed records frozen parameters from ZeRO-2 on, unless the save excluded them
    frozen = params.frozen() if e.stage >= 2 and "excluded" not in manifest else None
    rank = e.rank if e.world_size > 1 else 0
    shared = None
    if zero:  # DeepSpeed's rank 0 alone records the ties; at ZeRO-3 each rank reads its own file
        shared = _shared_params(e.module) if e.stage < 3 or rank == 0 else {}
    out: dict[str, Any] = {"buffer_names": _buffer_names(e.module)}
    if zero:
        out["optimizer"] = None  # ZeRO keeps its optimizer states in the optim_states files
    out.update({
        "param_shapes": params.group_shapes() if zero else None,
        "frozen_param_shapes": None if frozen is None else OrderedDict((n, params.shape(p)) for n, p in frozen),
        "shared_params": shared,
        "frozen_param_fragments": None if frozen is None else OrderedDict((n, params.fragment(p)) for n, p in frozen),
        "lr_scheduler": _scheduler_entry(e, manifest.get("scheduler")),
        "data_sampler": None,  # no curriculum learning
        "random_ltd": None,
        "skipped_steps": int(manifest["optimizer"]["skipped"]),
        "global_steps": manifest["step"],
        "global_samples": manifest["step"] * e.train_batch_size(),
        "dp_world_size": manifest["world_size"],
        "mp_world_size": 1,
        "checkpoint_parallel_dimensions": {"pp_degree": 1, "tp_degree": 1},
        # the config initialize was given (a file's, read: DeepSpeed keeps the path as given); this engine's,
        # where DeepSpeed's is the saving run's: a resume passes the same
        "ds_config": copy.deepcopy(getattr(e.config, "_given", None) or {}),
        "ds_version": __version__,
    })
    out.update(manifest["client_state"])
    return out

