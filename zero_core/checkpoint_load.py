"""Engine load of zbench checkpoints (any world size, stage or bucketing at save), verified in one pass.

Every rank reads, through the fragment maps, just the elements of its *current* partition. Each rank file
it needs is read once, front to back, and its checksum checked on the same bytes that become its states
(checkpoints/verified_read.py; pinned buffers and non-blocking copies when the states are on a GPU). Sizes and
safetensors headers are checked before anything changes; a file that fails its checksum is found once read,
so the error says the states were partly overwritten. NVMe-backed states do not fit in memory at once: their
files are checked first and then read chunk by chunk. RNG states are plain data (rng_state.py).
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from checkpoints import manifest as mf
from checkpoints import zbench_format as fmt
from checkpoints.detect import holds_checkpoint_folder, locate, lost_dcp_metadata
from checkpoints.manifest_checks import POINTERS
from checkpoints.source import CheckpointError
from checkpoints.verified_read import read_verified
from checkpoints.zbench_source import FragmentReader, read_frozen

from .checkpoint_client_state import LoadFlags, returned, zbench_entries
from .client_state_codec import ENCODING_KEY
from .client_state_codec import decode as decode_client_state
from .checkpoint_model_match import report_kept, zbench_model_match
from .checkpoint_non_strict import report
from .group_values_record import check_group_count, restore_group_values
from .host_schedules import GroupLrs, TorchScheduler
from .optim.client_optimizer import ClientOptimizer
from .optim.facade import EngineScheduler
from .optim.states import NAMES, TensorStates
from .rng_state import restore_rng

if TYPE_CHECKING:
    from .engine import Engine


def param_entries(engine: "Engine") -> list[dict[str, Any]]:
    slot_of = {id(p): i for i, p in enumerate(engine.params)}
    return mf.param_entries(engine.module.state_dict(keep_vars=True).items(), slot_of)


def _check_states(folder: Path, manifest: dict[str, Any], opt: Any, groups: list[dict]) -> list[str]:
    """The optimizer state arrays to read; CheckpointError when they belong to another kind of optimizer, or to
    another number of parameter groups than `groups` (the optimizer's)."""
    check_group_count(folder, manifest["optimizer"], groups)
    saved = mf.partition_keys(manifest)[1:]
    client = isinstance(opt, ClientOptimizer)
    if client != all(k.startswith("state.") for k in saved) or (not client and tuple(saved) != NAMES[1:]):
        kind = manifest["optimizer"].get("client") or "AdamW/Adam"
        raise CheckpointError(
            f"{folder} holds the states of a {kind} optimizer, not of this "
            f"{type(opt.client).__name__ if client else 'AdamW/Adam'}; load the weights alone "
            "(load_optimizer_states=False) or use the optimizer the run used"
        )
    return saved


def _fragment_pieces(mine: list, names: list[str], lo: int, hi: int):
    """(name, partition range a..b, parameter element start) of this rank's fragments inside [lo, hi)."""
    for f, name in zip(mine, names):
        a, b = max(lo, f.partition_offset), min(hi, f.partition_offset + f.numel)
        if a < b:
            yield name, a, b, f.param_start + a - f.partition_offset


def read_fragments(reader: Any, mine: list, names: list[str], lo: int, into: dict[str, torch.Tensor]) -> None:
    """Fill `into[key]` (holding partition elements [lo, lo + numel)) from the checkpoint's fragments."""
    hi = lo + next(iter(into.values())).numel() if into else lo
    for name, a, b, start in _fragment_pieces(mine, names, lo, hi):
        for key, dst in into.items():
            piece = torch.empty(b - a, dtype=torch.float32)
            reader.read_into(piece, name, key, start)
            dst[a - lo : b - lo].copy_(piece)


def _read_in_one_pass(
    folder: Path, manifest: dict[str, Any], reader: Any, mine: list, names: list[str], into: dict[str, torch.Tensor]
) -> None:
    """Fill `into[key]` (the whole partition) reading each rank file once, its checksum checked on the way."""
    numel = next(iter(into.values())).numel()
    spans = defaultdict(list)
    for name, a, b, start in _fragment_pieces(mine, names, 0, numel):
        for key, dst in into.items():
            for fname, span in reader.spans(dst[a:b], name, key, start):
                spans[fname].append(span)
    for fname in sorted(spans):
        try:
            read_verified(folder / fname, manifest["files"][fname], spans[fname])
        except CheckpointError as e:
            raise CheckpointError(
                f"{e}; this engine's states were partly overwritten by the load: load a sound "
                "checkpoint before training on"
            ) from None
        except FileNotFoundError:
            raise CheckpointError(
                f"{folder / fname} disappeared while it was read (another process removed this "
                "checkpoint, e.g. a save with keep_last); load a newer one"
            ) from None


def restore_counters(engine: "Engine", folder: Path, applied: int, skipped: int, step: int, micro_steps: int,
                     scheduler: Any, schedule: bool = True, lrs: Any = None, betas: Any = None) -> None:
    """The update counts a checkpoint saved, and its scheduler state (None: the schedule follows the counts), loaded
    where `schedule`; `lrs`, `betas`: what its optimizer's groups held, where it says (the config's scheduler takes
    them to after_load; a passed torch scheduler not loaded stays where it was, its groups taking the lrs)."""
    if isinstance(engine.lr_scheduler, EngineScheduler):  # the config's schedule, before the counts move
        engine.lr_scheduler.saved_position(scheduler, lrs, betas)
    groups, own = engine.client_optimizer.param_groups, engine.host_schedule
    if (engine.lr_scheduler is None and (own is None or isinstance(own, GroupLrs)) and isinstance(lrs, list)
            and len(lrs) == len(groups)):  # no schedule: the groups hold what a loop set; DeepSpeed's load restores it
        for group, lr in zip(groups, lrs):
            group["lr"] = float(lr)
    applied_before = engine.applied_steps()
    engine.optimizer.applied.fill_(applied)
    engine.optimizer.skipped.fill_(skipped)
    engine.global_step, engine.micro_steps = step, micro_steps
    engine.steps_not_applied = 0  # the loaded optimizer's count is the run's
    if not schedule and isinstance(engine.host_schedule, TorchScheduler):
        engine.host_schedule.stay(engine.applied_steps() - applied_before, lrs, betas)
    if schedule and scheduler and engine.host_schedule is not None:
        _load_scheduler(engine, folder, scheduler)


def _load_scheduler(engine: "Engine", folder: Path, scheduler: Any) -> None:
    try:
        engine.host_schedule.load_state_dict(scheduler)
    except ValueError as e:
        raise CheckpointError(f"{folder}: {e}; build the same scheduler as the run that saved it, or pass "
                              "load_lr_scheduler_states=False") from None


def restore_steps(engine: "Engine", folder: Path, step: int, micro_steps: int, skipped: int, scheduler: Any = None,
                  schedule: bool = False) -> None:
    """The run's counters alone, as DeepSpeed's load_optimizer_states=False restores them; the optimizer's own count
    of applied updates (Adam's step) goes on. The config's scheduler is given the saved scheduler state, which it
    takes where `schedule` (load_lr_scheduler_states, as DeepSpeed's does); so does a torch scheduler passed to
    initialize, while its groups keep their lrs (DeepSpeed loads no optimizer groups then)."""
    if isinstance(engine.lr_scheduler, EngineScheduler):  # before the counts move
        engine.lr_scheduler.saved_position(scheduler)
    engine.optimizer.skipped.fill_(skipped)
    engine.global_step, engine.micro_steps = step, micro_steps
    torch_scheduler = engine.host_schedule
    if schedule and scheduler and isinstance(torch_scheduler, TorchScheduler):
        groups = torch_scheduler.scheduler.optimizer.param_groups
        lrs, stepped = [g["lr"] for g in groups], torch_scheduler.stepped
        _load_scheduler(engine, folder, scheduler)
        torch_scheduler.stepped = stepped  # stepped as often as this optimizer's own count of updates, which goes on
        for group, lr in zip(groups, lrs):
            group["lr"] = lr


def nothing_to_resume(load_dir: str | os.PathLike) -> bool:
    """A first run's resume: no such folder, or one holding no `latest` and no checkpoint of any format (where
    DeepSpeed's load warns and returns (None, None)). Tag folders without `latest`: load() names them."""
    root = Path(load_dir)
    try:
        if not root.exists():
            return True
        if not root.is_dir() or any(os.path.lexists(root / n) for n in POINTERS) or (root / mf.MANIFEST).is_file():
            return False
        if locate(load_dir, None) is not None or fmt.complete_tags(root) or lost_dcp_metadata(root):
            return False
        return not holds_checkpoint_folder(root)  # a DeepSpeed tag folder without `latest` is no first run
    except (OSError, CheckpointError):
        return False  # load() says what is wrong with it


def load(engine: "Engine", load_dir: str | os.PathLike, tag: str | None = None, weights_only: bool = False,
         schedule: bool = True, counters: bool = False, flags: LoadFlags = LoadFlags()) -> tuple[str, dict[str, Any]]:
    """Collective. Loads weights, optimizer state and counters into this engine (`weights_only`: the fp32 weights
    alone, the optimizer untouched, and the step counters too with `counters`); returns (the file this rank's model
    states came from, as DeepSpeed's load names its model-states file (a DCP save: its folder), client_state): a
    zbench or DeepSpeed checkpoint's as DeepSpeed's load given `flags` returns it, a DCP one's as saved."""
    try:
        folder, refusal = fmt.resolve(load_dir, tag), None
    except CheckpointError as e:
        folder, refusal = None, e
    if folder is None:  # outside the except block: another format's own errors are not shown chained to this one
        found = locate(load_dir, tag)
        if found is None and lost_dcp_metadata(Path(load_dir)):
            raise CheckpointError(f"{load_dir} holds DCP chunk files but no .metadata file; copy it from the save")
        if found is None or found[1] == "zbench":
            assert refusal is not None
            raise refusal
        if found[1] in ("deepspeed", "deepspeed-universal"):
            from .checkpoint_deepspeed import load_deepspeed

            folder, client_state = load_deepspeed(engine, found[0], found[1], weights_only, schedule, counters, flags)
            rank = engine.rank if engine.layout.world_size > 1 else 0  # the client_state's file, as theirs
            return as_given(load_dir, folder, deepspeed_model_file(folder, rank, "universal" in found[1])), client_state
        if found[1] == "dcp":
            from .checkpoint_dcp import load_dcp

            folder, client_state = load_dcp(engine, found[0], weights_only, schedule, counters, flags.strict)
            return str(folder), client_state  # no model-states file: each tensor is spread over every rank's
        raise CheckpointError(
            f"{load_dir} holds a {found[1]} checkpoint; load_checkpoint resumes zbench, DeepSpeed and DCP checkpoints: "
            "start from its weights with deepspeed.utils.zero_to_fp32.load_state_dict_from_zero_checkpoint(model, "
            "dir) before initialize"
        )
    identity = fmt.folder_identity(folder)
    try:
        folder, manifest, model_file = _load_zbench(engine, folder, weights_only, schedule, counters, flags.strict)
    except CheckpointError:
        if fmt.folder_identity(folder) == identity:
            raise
        raise CheckpointError(f"{folder} was replaced while it was read (another process saved that tag again); "
                              "this engine's states may be partly overwritten: load it again") from None
    client_state = returned(zbench_entries(engine, manifest), flags) if flags.deepspeed else manifest["client_state"]
    return as_given(load_dir, folder, model_file), client_state


def as_given(load_dir: str | os.PathLike, folder: Path, name: str) -> str:
    """`name` in `folder` spelled from `load_dir` as given (relative stays relative), as DeepSpeed's
    join(load_dir, tag, name)."""
    try:
        return os.path.join(load_dir, *Path(folder).resolve().relative_to(Path(load_dir).resolve()).parts, name)
    except (OSError, ValueError):
        return str(Path(folder) / name)


def deepspeed_model_file(folder: Path, rank: int, universal: bool) -> str:
    """The DeepSpeed model-states file the client_state comes from (checkpoint_client_state.deepspeed_file_entries):
    a ZeRO-3 save's file of this rank where it has one, else mp_rank_00's (ZeRO 0-2) or rank 0's."""
    names = [] if universal else [f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt"]
    names.append("mp_rank_00_model_states.pt")
    return next((n for n in names if (folder / n).is_file()), "zero_pp_rank_0_mp_rank_00_model_states.pt")


def _load_zbench(engine: "Engine", folder: Path, weights_only: bool, schedule: bool,
                 counters: bool, strict: bool = True) -> tuple[Path, dict[str, Any], str]:
    """(the folder, its manifest, the file this rank's weights came from: its own where read, else the first read)."""
    manifest = mf.read(folder)
    manifest["client_state"] = decode_client_state(manifest, folder)  # refused before any change
    manifest.pop(ENCODING_KEY, None)  # decoded once: what the loaders pass on is the saved values
    current = param_entries(engine)
    left_out, kept = zbench_model_match(folder, manifest, current, strict, weights_only)
    absent = set(left_out.missing) | set(kept)  # these keep the model's values
    reader = FragmentReader(folder, manifest)  # after the model checks: nothing opened for a refused checkpoint
    mine = engine.layout.fragments(engine.rank if engine.layout.world_size > 1 else 0)
    mine = [f for f in mine if engine.layout.slots[f.param_index].name not in absent]
    names = [engine.layout.slots[f.param_index].name for f in mine]
    opt = engine.optimizer
    one_pass = isinstance(opt.states, TensorStates)
    needed = reader.files_for(names)
    model_file = next((f for f in (mf.rank_file(engine.rank), *needed) if f in needed), mf.MANIFEST)
    for fname in needed:
        reader.check_header(fname)  # present, and holding what the manifest says, before any change
    if not one_pass:
        mf.check_files(folder, manifest, needed)
    rng = manifest["rng"].get(str(engine.rank)) if manifest["world_size"] == engine.world_size else None
    restore = restore_rng(rng, manifest["version"], folder) if rng is not None else None  # checked before any change
    saved_states = [] if weights_only else _check_states(folder, manifest, opt, engine.client_optimizer.param_groups)
    client = isinstance(opt, ClientOptimizer)
    frozen = [e["name"] for e in current if not (e["trainable"] or e["tied_to"] or e["name"] in absent)]
    frozen_values = read_frozen(folder, manifest, frozen, verify=True)  # small: verified before any change
    with torch.no_grad():
        try:
            into_states = ("master",) if weights_only or client else NAMES
            arrays = {k: torch.zeros(opt.states.numel, dtype=torch.float32) for k in saved_states} if client else {}
            if one_pass:
                _read_in_one_pass(folder, manifest, reader, mine, names,
                                  {**{k: getattr(opt.states, k) for k in into_states}, **arrays})
            else:
                for lo, hi, views in opt.states.stream():  # NVMe chunk by chunk (written back)
                    read_fragments(reader, mine, names, lo, {k: views[k] for k in into_states})
                if arrays:
                    read_fragments(reader, mine, names, 0, arrays)
            if client and saved_states:
                opt.load_state_arrays(arrays, manifest["optimizer"].get("client_scalars", {}))
        finally:
            reader.close()
        state = engine.module.state_dict(keep_vars=True)
        for name, t in frozen_values.items():
            state[name].data.copy_(t)
        engine.refresh_working_weights()
        report(folder, left_out, engine.rank)
        report_kept(folder, kept, engine.rank)
        if weights_only:
            if counters:
                restore_steps(engine, folder, manifest["step"], manifest["micro_steps"],
                              manifest["optimizer"]["skipped"], manifest.get("scheduler"), schedule)
            return folder, manifest, model_file
        o = manifest["optimizer"]
        engine.scaler.load_state_dict(manifest["loss_scaler"])
    # the groups' weight_decay, eps and betas the run saved (checked when the manifest was read), as DeepSpeed's load
    saved_betas = restore_group_values(engine.client_optimizer.param_groups, o.get("group_values"))
    restore_counters(engine, folder, o["applied"], o["skipped"], manifest["step"], manifest["micro_steps"],
                     manifest.get("scheduler"), schedule, o.get("group_lrs"), saved_betas)
    if restore is not None:
        restore(engine.device)
    return folder, manifest, model_file
