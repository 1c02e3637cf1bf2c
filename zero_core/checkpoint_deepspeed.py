"""Resume a DeepSpeed checkpoint in zero_core, ZeRO-1/2/3 or universal (the output of `ds_to_universal.py`): the fp32
weights, Adam's moments and the step counters, on any number of ranks and at any stage (as DeepSpeed's own
`load_universal` does for universal ones).

Each rank reads, for every parameter it holds a fragment of, its whole fp32 weights, `exp_avg` and `exp_avg_sq`
through the checkpoint's source (checkpoints/deepspeed_source.py, deepspeed_universal_source.py: one parameter at a
time, so memory stays near the largest one) and keeps its fragment. Names and shapes are checked, and every file
this rank needs is found, before anything changes. The config's schedule goes on from the applied update count; a
passed scheduler is given the saved scheduler state (when the run saved one); the first update takes the lrs and
betas the saved optimizer's groups held, as DeepSpeed's loaded groups do; an fp16 run's dynamic loss scale goes
on from its saved scale, iteration, last overflow and hysteresis. Not carried over: the RNG states.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from checkpoints.deepspeed_source import DeepSpeedSource
from checkpoints.deepspeed_universal_source import UniversalSource
from checkpoints.manifest_state_checks import group_values_problem
from checkpoints.source import CheckpointError

from .checkpoint_client_state import LoadFlags, deepspeed_file_entries, returned
from .checkpoint_load import read_fragments, restore_counters, restore_steps
from .group_values_record import check_group_count, group_values_record, restore_group_values
from .checkpoint_model_match import check_trained_have_states, report_kept, untrained_to_load
from .checkpoint_non_strict import NameMatch, refuse_states, report
from .optim.client_optimizer import ClientOptimizer
from .optim.states import NAMES, TensorStates

if TYPE_CHECKING:
    from .engine import Engine


class _Reader:
    """`read_into(piece, name, key, start)` over a source's tensors, the last one of each key kept."""

    def __init__(self, source: DeepSpeedSource | UniversalSource) -> None:
        self.source = source
        self._last: dict[str, tuple[str, torch.Tensor]] = {}

    def read_into(self, piece: torch.Tensor, name: str, key: str, start: int) -> None:
        kept = self._last.get(key)
        if kept is None or kept[0] != name:
            full = self.source.load(name) if key == "master" else self.source.load_state(name, key)
            kept = self._last[key] = (name, full.reshape(-1))
        piece.copy_(kept[1][start : start + piece.numel()])


def load_deepspeed(engine: "Engine", folder: Path, kind: str, weights_only: bool, schedule: bool,
                   counters: bool = False, flags: LoadFlags = LoadFlags()) -> tuple[Path, dict[str, Any]]:
    """Collective (each rank reads its own fragments). Returns (the folder, the client_state DeepSpeed's load given
    `flags` returns: the model-states file's entries less those its engine takes)."""
    source = UniversalSource(folder) if kind == "deepspeed-universal" else DeepSpeedSource(folder)
    if source.model is None:
        raise CheckpointError(f"{folder} has no model-states files beside zero/; copy them from the run that saved it")
    groups = saved_groups(source) if isinstance(source, DeepSpeedSource) else None
    if groups is not None and not weights_only:  # before anything changes: the saved groups go back one for one
        check_group_count(folder, {"group_lrs": groups[0]}, engine.client_optimizer.param_groups)
    _, saved = load_foreign(engine, folder, source, weights_only, schedule, counters, groups, flags.strict)
    if groups is not None and not weights_only:  # as DeepSpeed's load puts its saved groups back (a loop may have
        record = group_values_record(source.saved_param_groups() or [])  # set them): numbers in range only
        if group_values_problem(record) is None:
            restore_group_values(engine.client_optimizer.param_groups, record)
    if not flags.deepspeed:
        return folder, saved
    rank = engine.rank if engine.layout.world_size > 1 else 0
    return folder, returned(deepspeed_file_entries(source.model, rank, kind == "deepspeed-universal"), flags)


def saved_groups(source: DeepSpeedSource) -> tuple[list[Any], list[Any]] | None:
    """(lr, betas) of each group of the optimizer state rank 0 saved: what DeepSpeed's groups hold after loading
    it, the next update's; None where the file does not hold them as plain numbers (the load then takes the
    schedule's lr at the saved position)."""
    groups = source.saved_param_groups()
    if groups is None:
        return None
    return [g.get("lr") for g in groups], [g.get("betas") for g in groups]  # checked where they are taken


def load_foreign(engine: "Engine", folder: Path, source: Any, weights_only: bool, schedule: bool,
                 counters: bool = False, groups: Any = None, strict: bool = True) -> tuple[Path, dict[str, Any]]:
    """Load another tool's checkpoint through `source`: its `params()`, `load(name)`, `load_state(name, key)`,
    `check_states(keys)`, `read_problems()`, `loss_scaler()` and `model` (the run's trainable names, step, skipped
    count, scheduler state and client_state), as DeepSpeedSource has them (checkpoint_dcp.py adapts a DCP folder).
    `groups`: (lrs, betas) the saved optimizer's groups held, where the checkpoint has them. `strict=False`: entries
    either side lacks are left out (checkpoint_non_strict.py)."""
    infos = {i.name: i for i in source.params()}
    rank = engine.rank if engine.layout.world_size > 1 else 0
    absent = [slot.name for slot in engine.layout.slots if slot.name not in infos]
    mine = [f for f in engine.layout.fragments(rank) if engine.layout.slots[f.param_index].name not in absent]
    names = [engine.layout.slots[f.param_index].name for f in mine]
    for slot in engine.layout.slots:
        info = infos.get(slot.name)
        if (info is None and strict) or (info is not None and (info.tied_to or math.prod(info.shape) != slot.numel)):
            found = "not in it" if info is None else f"{'tied' if info.tied_to else 'shape'} {info.shape}"
            raise CheckpointError(f"{folder} does not hold this model: {slot.name} {tuple(slot.shape)} is {found}; "
                                  "load the checkpoint of this model")
    ours = {slot.name for slot in engine.layout.slots}
    extra = [n for n in source.model.trainable if n not in ours]
    if extra and strict:
        raise CheckpointError(f"{folder} does not hold this model: it trains {extra[0]}, which this model does not; "
                              "load the checkpoint of this model")
    state = engine.module.state_dict(keep_vars=True)
    trained = {id(p) for p in engine.module.parameters() if p.requires_grad}  # a tied name of one is not frozen
    frozen, kept, skipped = untrained_to_load(folder, infos, source.model.trainable, state, trained, strict)
    left_out = NameMatch(absent + kept, extra + skipped)
    opt = engine.optimizer
    keys = ("master",) if weights_only or isinstance(opt, ClientOptimizer) else NAMES
    refuse_states(folder, NameMatch(absent, extra), weights_only)  # frozen entries hold no states; none if strict
    if keys[1:]:
        check_trained_have_states(folder, [slot.name for slot in engine.layout.slots], source.model.trainable)
    source.check_states(keys[1:])  # the moments are all there before anything changes
    frozen_values = {n: source.load(n) for n in frozen}
    if strict:
        report_kept(folder, kept, engine.rank)
    reader = _Reader(source)
    with torch.no_grad():
        if isinstance(opt.states, TensorStates):
            read_fragments(reader, mine, names, 0, {k: getattr(opt.states, k) for k in keys})
        else:
            for lo, _, views in opt.states.stream():  # NVMe chunk by chunk (written back)
                read_fragments(reader, mine, names, lo, {k: views[k] for k in keys})
        problems = source.read_problems()  # CRCs of every record read (torch.save's zip records carry them)
        if problems:
            raise CheckpointError(f"{problems[0]}; this engine's states were partly overwritten by the load: load a "
                                  "sound checkpoint before training on")
        for name, t in frozen_values.items():
            state[name].data.copy_(t)
        engine.refresh_working_weights()
    if not strict:
        report(folder, left_out, engine.rank)
    model = source.model
    steps = int(model.step or 0)
    applied = steps - model.skipped
    saved = {"scheduler": model.lr_scheduler, "stepped": applied} if isinstance(model.lr_scheduler, dict) else None
    if not weights_only:
        restore_counters(engine, folder, applied, model.skipped, steps, steps * engine.gradient_accumulation_steps(),
                         saved, schedule, *(groups or (None, None)))
        scaler = source.loss_scaler()
        if scaler is not None and engine.scaler.dynamic:  # an fp16 run's scale and its window go on where they were
            engine.scaler.load_state_dict(scaler)
    elif counters:
        restore_steps(engine, folder, steps, steps * engine.gradient_accumulation_steps(), model.skipped, saved,
                      schedule)
    return folder, dict(model.client_state)
