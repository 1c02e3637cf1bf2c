"""Engine save/load in zbench's checkpoint format (checkpoints/manifest.py), resharding on load.

Save: every rank writes only its own partition (no gather); rank 0 adds frozen tensors and the
manifest and commits atomically (checkpoints/zbench_format.py). A rank that cannot write (disk full,
quota, permissions) does not leave the others waiting: the ranks agree on the outcome, rank 0 removes
the staging folder it made, and every rank raises the same one-line CheckpointError; `latest` and the
previous checkpoint stay as they were.
Load: every rank reads, through the fragment maps, just the elements of its *current* partition,
whatever world size, stage or bucketing the save used. RNG states are plain data (rng_state.py).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import save_file

from checkpoints import manifest as mf
from checkpoints import zbench_format as fmt
from checkpoints.io_errors import ACCESS, SPACE, write_cause
from checkpoints.paths import plain_name
from checkpoints.source import CheckpointError
from checkpoints.zbench_source import FragmentReader, read_frozen

from . import comm
from .optim.client_optimizer import ClientOptimizer
from .optim.states import NAMES, TensorStates
from .rng_state import capture_rng, restore_rng

if TYPE_CHECKING:
    from .engine import Engine

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
_FIXES = {SPACE: "free space on that disk or pass another save_dir, then save again",
          ACCESS: "make the folder writable or pass another save_dir, then save again",
          None: "fix that and save again"}


def _cause(e: BaseException) -> tuple[str, str]:
    """(what went wrong, how to fix it) for a failed write."""
    what, kind = write_cause(e)
    return what, _FIXES[kind]


def _save_failed(root: Path, tag: str, problem: tuple[str, str]) -> CheckpointError:
    try:
        latest = fmt.read_latest(root) if root.is_dir() else None
    except CheckpointError:
        latest = None
    before = f"the previous checkpoint ({latest}) and 'latest' are unchanged" if latest else "no earlier checkpoint exists there"
    return CheckpointError(f"checkpoint {tag} was not saved in {root}: {problem[0]}; {problem[1]}; {before}")


def _write_synced(tensors: dict[str, torch.Tensor], path: Path) -> dict[str, Any]:
    save_file({k: v.contiguous().cpu() for k, v in tensors.items()}, str(path))
    fmt.fsync_path(path)
    return mf.file_record(path)


def _write_states(opt: Any, path: Path) -> dict[str, Any]:
    """This rank's master and optimizer states (Adam's moments, or a client optimizer's per-element state);
    states on NVMe are streamed chunk by chunk, never whole in memory."""
    states = opt.states
    if isinstance(opt, ClientOptimizer):
        return _write_synced({"master": states.master, **opt.state_arrays()[0]}, path)
    if isinstance(states, TensorStates):
        return _write_synced({n: getattr(states, n) for n in NAMES}, path)
    from checkpoints.safetensors_stream import StreamingWriter

    writer = StreamingWriter(path, [(n, torch.float32, [states.numel]) for n in NAMES])
    for n in NAMES:
        for _, _, views in states.stream((n,), write_back=False):
            writer.write(views[n])
    writer.close()  # fsyncs
    return mf.file_record(path)


def _param_entries(engine: "Engine") -> list[dict[str, Any]]:
    slot_of = {id(p): i for i, p in enumerate(engine.params)}
    return mf.param_entries(engine.module.state_dict(keep_vars=True).items(), slot_of)


def _prepare(root: Path, tag: str) -> tuple[Path, list[Path]]:
    """Rank 0: the root folder, a tag replaced by a save that died put back, and a fresh staging folder;
    also the staging folders that dead saves left (reported, never removed: they are not ours)."""
    root.mkdir(parents=True, exist_ok=True)
    fmt.recover(root)
    staged = fmt.staging_dir(root, tag, fmt.new_token())
    staged.mkdir()
    return staged, fmt.leftovers(root)


def save(engine: "Engine", save_dir: str | os.PathLike, tag: str | None = None,
         client_state: dict[str, Any] | None = None, keep_last: int | None = None, move_latest: bool = True) -> Path:
    """Collective. Returns the committed checkpoint folder."""
    root = Path(save_dir)
    tag = plain_name(tag or f"global_step{engine.global_step}", "checkpoint tag", "pass a plain folder name as tag")
    if keep_last is not None and (isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1):
        raise CheckpointError(f"keep_last must be a whole number >= 1 or None, got {keep_last!r}")
    staged, problem = root, None
    if engine.rank == 0:
        try:
            staged, stale = _prepare(root, tag)
            if stale:
                print(f"zero_core: {len(stale)} folder(s) left in {root} by saves that died ({', '.join(d.name for d in stale[:3])}); "
                      "they hold disk space: delete them once no save is running", flush=True)
        except OSError as e:
            what, fix = _cause(e)
            problem = (f"cannot create {e.filename or root} ({what})", fix)
    staged, problem = comm.broadcast_object((str(staged), problem), what="broadcast of the checkpoint folder's status")
    staged = Path(staged)
    if problem:
        raise _save_failed(root, tag, problem)
    files: dict[str, Any] = {}
    writes_partition = engine.layout.world_size > 1 or engine.rank == 0  # stage 0: one copy is enough
    target = staged
    try:
        if writes_partition:
            name = mf.rank_file(engine.rank)
            target = staged / name
            files[name] = _write_states(engine.optimizer, target)
        if engine.rank == 0:
            frozen = {e["name"]: t.detach() for e, t in zip(_param_entries(engine), engine.module.state_dict(keep_vars=True).values())
                      if not e["trainable"] and not e["tied_to"]}  # safetensors stores shared storage once
            target = staged / mf.FROZEN_FILE
            files[mf.FROZEN_FILE] = _write_synced(frozen, target)
    except Exception as e:  # OSError, or safetensors' own error type carrying the OS error's text
        what, fix = _cause(e)
        problem = (f"rank {engine.rank} could not write {target} ({what})", fix)
    gathered = comm.all_gather_object({"files": files, "rng": capture_rng(engine.device), "problem": problem},
                                      what="all-gather of the checkpoint's file list")
    problem = next((g["problem"] for g in gathered if g["problem"]), None)
    if engine.rank == 0 and problem is None:
        try:
            mf.write(staged, _manifest(engine, tag, {k: v for g in gathered for k, v in g["files"].items()},
                                       {str(r): g["rng"] for r, g in enumerate(gathered)}, client_state))
            fmt.commit(root, tag, staged, move_latest)
        except OSError as e:
            what, fix = _cause(e)
            problem = (f"rank 0 could not write the manifest or commit {tag} ({what})", fix)
    if engine.rank == 0 and problem is not None:
        shutil.rmtree(staged, ignore_errors=True)  # made by this rank's _prepare above
    problem = comm.broadcast_object(problem, what="broadcast of the checkpoint's commit status")
    if problem:
        raise _save_failed(root, tag, problem)
    if engine.rank == 0 and keep_last:
        fmt.prune(root, keep_last)
    return root / tag


def _manifest(engine: "Engine", tag: str, files: dict[str, Any], rng: dict[str, Any],
              client_state: dict[str, Any] | None) -> dict[str, Any]:
    c, opt = engine.config, engine.optimizer
    return {
        "format": mf.FORMAT, "version": mf.VERSION, "tag": tag, "step": engine.global_step,
        "micro_steps": engine.micro_steps, "world_size": engine.world_size, "stage": engine.stage,
        "dtype": _DTYPE_NAMES[engine.dtype], "layout": mf.layout_record(engine.layout),
        "params": _param_entries(engine), "fragments": mf.fragment_records(engine.layout), "files": files,
        "optimizer": {"type": c.optimizer.type, "lr": c.optimizer.params.lr, "betas": list(c.optimizer.params.betas),
                      "eps": c.optimizer.params.eps, "weight_decay": c.optimizer.params.weight_decay,
                      "decoupled": c.optimizer.decoupled, "gradient_clipping": c.gradient_clipping,
                      "applied": float(opt.applied), "skipped": float(opt.skipped), **_optimizer_states(opt)},
        "loss_scaler": {k: (v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in engine.scaler.state_dict().items()},
        "rng": rng, "client_state": client_state or {},
        "scheduler": engine.host_schedule.state_dict() if engine.host_schedule is not None else {},
    }


def _optimizer_states(opt: Any) -> dict[str, Any]:
    """What the rank files hold besides the master, and a client optimizer's shared scalars."""
    if not isinstance(opt, ClientOptimizer):
        return {"state_keys": list(NAMES[1:])}
    arrays, scalars = opt.state_arrays()
    return {"state_keys": sorted(arrays), "client": type(opt.client).__name__, "client_scalars": scalars}


def _check_states(folder: Path, manifest: dict[str, Any], opt: Any) -> list[str]:
    """The optimizer state arrays to read; CheckpointError when they belong to another kind of optimizer."""
    saved = mf.partition_keys(manifest)[1:]
    client = isinstance(opt, ClientOptimizer)
    if client != all(k.startswith("state.") for k in saved) or (not client and tuple(saved) != NAMES[1:]):
        kind = manifest["optimizer"].get("client") or "AdamW/Adam"
        raise CheckpointError(f"{folder} holds the states of a {kind} optimizer, not of this "
                              f"{type(opt.client).__name__ if client else 'AdamW/Adam'}; load the weights alone "
                              "(load_optimizer_states=False) or use the optimizer the run used")
    return saved


def _check_model(folder: Path, manifest: dict[str, Any], current: list[dict[str, Any]]) -> None:
    saved = {p["name"]: p for p in manifest["params"]}
    missing = [e["name"] for e in current if e["name"] not in saved]
    unexpected = [n for n in saved if n not in {e["name"] for e in current}]
    if missing or unexpected:
        raise CheckpointError(f"{folder} is from another model: missing {missing[:3]} unexpected {unexpected[:3]}; "
                              "load a checkpoint of this model")
    for e in current:
        if list(saved[e["name"]]["shape"]) != e["shape"] or saved[e["name"]]["trainable"] != e["trainable"]:
            raise CheckpointError(f"{folder}: {e['name']} is {saved[e['name']]['shape']} in the checkpoint but {e['shape']} "
                                  "in the model; load a checkpoint of this model")


def _read_fragments(reader: Any, mine: list, names: list[str], lo: int, into: dict[str, torch.Tensor]) -> None:
    """Fill `into[key]` (holding partition elements [lo, lo + numel)) from the checkpoint's fragments."""
    hi = lo + next(iter(into.values())).numel() if into else lo
    for f, name in zip(mine, names):
        a, b = max(lo, f.partition_offset), min(hi, f.partition_offset + f.numel)
        if a >= b:
            continue
        for key, dst in into.items():
            piece = torch.empty(b - a, dtype=torch.float32)
            reader.read_into(piece, name, key, f.param_start + a - f.partition_offset)
            dst[a - lo : b - lo].copy_(piece)


def load(engine: "Engine", load_dir: str | os.PathLike, tag: str | None = None, weights_only: bool = False,
         schedule: bool = True) -> tuple[Path, dict[str, Any]]:
    """Collective. Loads weights, optimizer state and counters into this engine (`weights_only`: the fp32
    weights alone, the optimizer untouched); returns (the checkpoint folder, client_state)."""
    folder = fmt.resolve(load_dir, tag)
    manifest = mf.read(folder)
    current = _param_entries(engine)
    _check_model(folder, manifest, current)
    reader = FragmentReader(folder, manifest)  # after the model checks: nothing opened for a refused checkpoint
    mine = engine.layout.fragments(engine.rank if engine.layout.world_size > 1 else 0)
    names = [engine.layout.slots[f.param_index].name for f in mine]
    mf.check_files(folder, manifest, reader.files_for(names) + [mf.FROZEN_FILE])
    rng = manifest["rng"].get(str(engine.rank)) if manifest["world_size"] == engine.world_size else None
    restore = restore_rng(rng, manifest["version"], folder) if rng is not None else None  # checked before any change
    opt = engine.optimizer
    saved_states = [] if weights_only else _check_states(folder, manifest, opt)
    client = isinstance(opt, ClientOptimizer)
    with torch.no_grad():
        try:
            into_states = ("master",) if weights_only or client else NAMES
            for lo, hi, views in opt.states.stream():  # one piece, or NVMe chunk by chunk (written back)
                _read_fragments(reader, mine, names, lo, {k: views[k] for k in into_states})
            if client and saved_states:
                arrays = {k: torch.zeros(opt.states.numel, dtype=torch.float32) for k in saved_states}
                _read_fragments(reader, mine, names, 0, arrays)
                opt.load_state_arrays(arrays, manifest["optimizer"].get("client_scalars", {}))
        finally:
            reader.close()
        state = engine.module.state_dict(keep_vars=True)
        frozen = [e["name"] for e in current if not e["trainable"] and not e["tied_to"]]
        for name, t in read_frozen(folder, manifest, frozen).items():
            state[name].data.copy_(t)
        engine.refresh_working_weights()
        if weights_only:
            return folder, manifest["client_state"]
        o = manifest["optimizer"]
        opt.applied.fill_(o["applied"])
        opt.skipped.fill_(o["skipped"])
        engine.scaler.load_state_dict(manifest["loss_scaler"])
    engine.global_step = manifest["step"]
    engine.micro_steps = manifest["micro_steps"]
    if schedule and engine.host_schedule is not None and manifest.get("scheduler"):
        try:
            engine.host_schedule.load_state_dict(manifest["scheduler"])
        except ValueError as e:
            raise CheckpointError(f"{folder}: {e}; build the same scheduler as the run that saved it, or pass "
                                  "load_lr_scheduler_states=False") from None
    if restore is not None:
        restore(engine.device)
    return folder, manifest["client_state"]
