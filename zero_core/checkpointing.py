"""Engine save/load in zbench's checkpoint format, resharding on load.

Save: every rank writes only its own partition (no gather); rank 0 adds frozen tensors and the
manifest and commits atomically. Load: every rank reads, through the fragment maps, just the
elements of its *current* partition, whatever world size, stage or bucketing the save used.
"""

from __future__ import annotations

import base64
import os
import random
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from checkpoints import zbench_format as fmt
from checkpoints.safetensors_read import SafetensorsFile
from checkpoints.source import CheckpointError
from checkpoints.zbench_source import FragmentReader

from . import comm

if TYPE_CHECKING:
    from .engine import Engine

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _gather_objects(obj: Any) -> list[Any]:
    if comm.world_size() == 1:
        return [obj]
    out: list[Any] = [None] * comm.world_size()
    dist.all_gather_object(out, obj)
    return out


def _barrier() -> None:
    if comm.world_size() > 1:
        dist.barrier()


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
    if engine.rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(staged, ignore_errors=True)  # debris of a save that crashed
        staged.mkdir()
    _barrier()
    opt = engine.optimizer
    files: dict[str, Any] = {}
    writes_partition = engine.layout.world_size > 1 or engine.rank == 0  # stage 0: one copy is enough
    if writes_partition:
        name = fmt.rank_file(engine.rank)
        files[name] = _write_synced({"master": opt.master, "exp_avg": opt.exp_avg, "exp_avg_sq": opt.exp_avg_sq}, staged / name)
    if engine.rank == 0:
        frozen = {e["name"]: t.detach() for e, t in zip(_param_entries(engine), engine.module.state_dict(keep_vars=True).values())
                  if not e["trainable"] and not e["tied_to"]}  # safetensors stores shared storage once
        files[fmt.FROZEN_FILE] = _write_synced(frozen, staged / fmt.FROZEN_FILE)
    gathered = _gather_objects({"files": files, "rng": _rng_state(engine.device)})
    if engine.rank == 0:
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
        fmt.write_json_atomic(staged / fmt.MANIFEST, manifest)
        fmt.commit(root, tag)
        if keep_last:
            fmt.prune(root, keep_last)
    _barrier()
    return root / tag


def load(engine: "Engine", load_dir: str | os.PathLike, tag: str | None = None) -> dict[str, Any]:
    """Collective. Loads weights, optimizer state and counters into this engine; returns client_state."""
    folder = fmt.resolve(load_dir, tag)
    manifest = fmt.read_manifest(folder)
    reader = FragmentReader(folder, manifest)
    saved = {p["name"]: p for p in manifest["params"]}
    current = _param_entries(engine)
    missing = [e["name"] for e in current if e["name"] not in saved]
    unexpected = [n for n in saved if n not in {e["name"] for e in current}]
    if missing or unexpected:
        raise CheckpointError(f"{folder} is from another model: missing {missing[:3]} unexpected {unexpected[:3]}; load a checkpoint of this model")
    for e in current:
        if list(saved[e["name"]]["shape"]) != e["shape"] or saved[e["name"]]["trainable"] != e["trainable"]:
            raise CheckpointError(f"{folder}: {e['name']} is {saved[e['name']]['shape']} in the checkpoint but {e['shape']} in the model; load a checkpoint of this model")
    mine = engine.layout.fragments(engine.rank if engine.layout.world_size > 1 else 0)
    names = [engine.layout.slots[f.param_index].name for f in mine]
    fmt.check_files(folder, manifest, reader.files_for(names) + [fmt.FROZEN_FILE])
    opt = engine.optimizer
    with torch.no_grad():
        try:
            for f, name in zip(mine, names):
                for key, dst in (("master", opt.master), ("exp_avg", opt.exp_avg), ("exp_avg_sq", opt.exp_avg_sq)):
                    piece = torch.empty(f.numel, dtype=torch.float32)
                    reader.read_into(piece, name, key, f.param_start)
                    dst[f.partition_offset : f.partition_offset + f.numel].copy_(piece)
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
