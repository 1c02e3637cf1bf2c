"""Engine save/load in zbench's checkpoint format, resharding on load.

Save: every rank writes only its own partition (no gather); rank 0 adds frozen tensors and the
manifest and commits atomically. A rank that cannot write (disk full, quota, permissions) does not
leave the others waiting: the ranks agree on the outcome, the staged folder is removed, and every
rank raises the same one-line CheckpointError; `latest` and the previous checkpoint stay as they were.
Load: every rank reads, through the fragment maps, just the elements of its *current* partition,
whatever world size, stage or bucketing the save used.
"""

from __future__ import annotations

import base64
import os
import random
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import save_file

from checkpoints import zbench_format as fmt
from checkpoints.io_errors import ACCESS, SPACE, write_cause
from checkpoints.safetensors_read import SafetensorsFile
from checkpoints.source import CheckpointError
from checkpoints.zbench_source import FragmentReader

from . import comm
from .opt_states import NAMES, TensorStates

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
    latest = fmt.read_latest(root) if root.is_dir() else None
    before = f"the previous checkpoint ({latest}) and 'latest' are unchanged" if latest else "no earlier checkpoint exists there"
    return CheckpointError(f"checkpoint {tag} was not saved in {root}: {problem[0]}; {problem[1]}; {before}")


def _clear_debris(root: Path) -> None:
    """Staged folders of saves that crashed: they hold disk space a new save may need."""
    for d in root.glob(".*.partial"):
        if d.is_dir():
            shutil.rmtree(d, ignore_errors=True)


def _rng_state(device: torch.device) -> dict[str, Any]:
    state = {"torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(), "python": repr(random.getstate())}
    if device.type == "cuda":
        state["cuda"] = base64.b64encode(torch.cuda.get_rng_state(device).numpy().tobytes()).decode()
    return state


def _set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["torch"])), dtype=torch.uint8))
    random.setstate(eval(state["python"], {"__builtins__": {}}))  # a tuple of ints and a float: repr round-trips
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["cuda"])), dtype=torch.uint8), device)


def _write_synced(tensors: dict[str, torch.Tensor], path: Path) -> dict[str, Any]:
    save_file({k: v.contiguous().cpu() for k, v in tensors.items()}, str(path))
    fmt.fsync_path(path)
    return {"sha256": fmt.sha256_file(path), "bytes": path.stat().st_size}


def _write_states(states: Any, path: Path) -> dict[str, Any]:
    """This rank's master and moments; states on NVMe are streamed chunk by chunk, never whole in memory."""
    if isinstance(states, TensorStates):
        return _write_synced({n: getattr(states, n) for n in NAMES}, path)
    from checkpoints.safetensors_stream import StreamingWriter

    writer = StreamingWriter(path, [(n, torch.float32, [states.numel]) for n in NAMES])
    for n in NAMES:
        for _, _, views in states.stream((n,), write_back=False):
            writer.write(views[n])
    writer.close()  # fsyncs
    return {"sha256": fmt.sha256_file(path), "bytes": path.stat().st_size}


def _param_entries(engine: "Engine") -> list[dict[str, Any]]:
    """Every state-dict entry: trainable ones point at their layout slot, tied names at their owner."""
    slot_of = {id(p): i for i, p in enumerate(engine.params)}
    first_name: dict[int, str] = {}
    entries = []
    for name, t in engine.module.state_dict(keep_vars=True).items():
        entry: dict[str, Any] = {"name": name, "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."),
                                 "trainable": id(t) in slot_of, "tied_to": first_name.get(id(t)), "slot": None}
        if entry["trainable"] and entry["tied_to"] is None:
            entry["slot"] = slot_of[id(t)]
        first_name.setdefault(id(t), name)
        entries.append(entry)
    return entries


def save(engine: "Engine", save_dir: str | os.PathLike, tag: str | None = None,
         client_state: dict[str, Any] | None = None, keep_last: int | None = None) -> Path:
    """Collective. Returns the committed checkpoint folder."""
    root = Path(save_dir)
    tag = tag or f"global_step{engine.global_step}"
    if "/" in tag or tag.startswith("."):
        raise CheckpointError(f"tag {tag!r} must be a plain folder name (no '/', not starting with '.')")
    staged = fmt.partial_dir(root, tag)
    problem: tuple[str, str] | None = None
    if engine.rank == 0:
        try:
            root.mkdir(parents=True, exist_ok=True)
            _clear_debris(root)
            staged.mkdir()
        except OSError as e:
            what, fix = _cause(e)
            problem = (f"cannot create {staged} ({what})", fix)
    problem = comm.broadcast_object(problem, what="broadcast of the checkpoint folder's status")
    if problem:
        raise _save_failed(root, tag, problem)
    opt = engine.optimizer
    files: dict[str, Any] = {}
    writes_partition = engine.layout.world_size > 1 or engine.rank == 0  # stage 0: one copy is enough
    target = staged
    try:
        if writes_partition:
            name = fmt.rank_file(engine.rank)
            target = staged / name
            files[name] = _write_states(opt.states, target)
        if engine.rank == 0:
            frozen = {e["name"]: t.detach() for e, t in zip(_param_entries(engine), engine.module.state_dict(keep_vars=True).values())
                      if not e["trainable"] and not e["tied_to"]}  # safetensors stores shared storage once
            target = staged / fmt.FROZEN_FILE
            files[fmt.FROZEN_FILE] = _write_synced(frozen, target)
    except Exception as e:  # OSError, or safetensors' own error type carrying the OS error's text
        what, fix = _cause(e)
        problem = (f"rank {engine.rank} could not write {target} ({what})", fix)
    gathered = comm.all_gather_object({"files": files, "rng": _rng_state(engine.device), "problem": problem},
                                      what="all-gather of the checkpoint's file list")
    problem = next((g["problem"] for g in gathered if g["problem"]), None)
    if engine.rank == 0 and problem is None:
        layout = engine.layout
        all_files = {k: v for g in gathered for k, v in g["files"].items()}
        fragments = {fmt.rank_file(r): [[f.param_index, f.param_start, f.partition_offset, f.numel] for f in layout.fragments(r)]
                     for r in range(layout.world_size)}
        c = engine.config
        manifest = {
            "format": fmt.FORMAT, "version": fmt.VERSION, "tag": tag, "step": engine.global_step,
            "micro_steps": engine.micro_steps, "world_size": engine.world_size, "stage": engine.stage,
            "dtype": _DTYPE_NAMES[engine.dtype],
            "layout": {"world_size": layout.world_size, "align": layout.align, "partition_numel": layout.partition_numel,
                       "groups": [[s.index for s in g.slots] for g in layout.groups]},
            "params": _param_entries(engine), "fragments": fragments, "files": all_files,
            "optimizer": {"type": c.optimizer.type, "lr": c.optimizer.params.lr, "betas": list(c.optimizer.params.betas),
                          "eps": c.optimizer.params.eps, "weight_decay": c.optimizer.params.weight_decay,
                          "decoupled": c.optimizer.decoupled, "gradient_clipping": c.gradient_clipping,
                          "applied": float(opt.applied), "skipped": float(opt.skipped)},
            "loss_scaler": {k: (v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in engine.scaler.state_dict().items()},
            "rng": {str(r): g["rng"] for r, g in enumerate(gathered)},
            "client_state": client_state or {},
        }
        try:
            fmt.write_json_atomic(staged / fmt.MANIFEST, manifest)
            fmt.commit(root, tag)
        except OSError as e:
            what, fix = _cause(e)
            problem = (f"rank 0 could not write the manifest or commit {tag} ({what})", fix)
    if engine.rank == 0 and problem is not None:
        shutil.rmtree(staged, ignore_errors=True)
    problem = comm.broadcast_object(problem, what="broadcast of the checkpoint's commit status")
    if problem:
        raise _save_failed(root, tag, problem)
    if engine.rank == 0 and keep_last:
        fmt.prune(root, keep_last)
    return root / tag


def load(engine: "Engine", load_dir: str | os.PathLike, tag: str | None = None) -> dict[str, Any]:
    """Collective. Loads weights, optimizer state and counters into this engine; returns client_state."""
    folder = fmt.resolve(load_dir, tag)
    manifest = fmt.read_manifest(folder)
    saved = {p["name"]: p for p in manifest["params"]}
    current = _param_entries(engine)
    missing = [e["name"] for e in current if e["name"] not in saved]
    unexpected = [n for n in saved if n not in {e["name"] for e in current}]
    if missing or unexpected:
        raise CheckpointError(f"{folder} is from another model: missing {missing[:3]} unexpected {unexpected[:3]}; load a checkpoint of this model")
    for e in current:
        if list(saved[e["name"]]["shape"]) != e["shape"] or saved[e["name"]]["trainable"] != e["trainable"]:
            raise CheckpointError(f"{folder}: {e['name']} is {saved[e['name']]['shape']} in the checkpoint but {e['shape']} in the model; load a checkpoint of this model")
    reader = FragmentReader(folder, manifest)  # after the model checks: nothing opened for a refused checkpoint
    mine = engine.layout.fragments(engine.rank if engine.layout.world_size > 1 else 0)
    names = [engine.layout.slots[f.param_index].name for f in mine]
    fmt.check_files(folder, manifest, reader.files_for(names) + [fmt.FROZEN_FILE])
    opt = engine.optimizer
    with torch.no_grad():
        try:
            for lo, hi, views in opt.states.stream():  # one piece, or NVMe chunk by chunk (written back)
                for f, name in zip(mine, names):
                    a, b = max(lo, f.partition_offset), min(hi, f.partition_offset + f.numel)
                    if a >= b:
                        continue
                    for key in NAMES:
                        piece = torch.empty(b - a, dtype=torch.float32)
                        reader.read_into(piece, name, key, f.param_start + a - f.partition_offset)
                        views[key][a - lo : b - lo].copy_(piece)
        finally:
            reader.close()
        state = engine.module.state_dict(keep_vars=True)
        with SafetensorsFile(folder / fmt.FROZEN_FILE) as fz:
            for e in current:
                if not e["trainable"] and not e["tied_to"]:
                    state[e["name"]].data.copy_(fz.read(e["name"]))
        engine.refresh_working_weights()
        o = manifest["optimizer"]
        opt.applied.fill_(o["applied"])
        opt.skipped.fill_(o["skipped"])
        engine.scaler.load_state_dict(manifest["loss_scaler"])
    engine.global_step = manifest["step"]
    engine.micro_steps = manifest["micro_steps"]
    rng = manifest["rng"].get(str(engine.rank))
    if rng is not None and manifest["world_size"] == engine.world_size:
        _set_rng_state(rng, engine.device)
    return manifest["client_state"]
