"""Structural checks of a zbench manifest and of the files it describes.

A manifest is read from disk, so every value is checked against the others before anything trusts it:
types and ranges, slots against params, fragments against shapes (each trainable element stored exactly
once, inside its rank file's partition), rank files against the world size, and each safetensors header
against what the manifest says the file holds. Readers then never meet a KeyError, a negative offset or
a tensor of 10**24 elements. Each check returns a short problem text (None when sound).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from .checksums import entry_problem
from .dtypes import FLOAT_NAMES, NAME_OF_CODE, NAMES
from .paths import plain_name
from .source import CheckpointError

POINTERS = ("latest", "latest_universal")  # files beside the tag folders

MAX_NUMEL = 1 << 48  # elements in one tensor or one partition: far beyond any model, far below overflow
MAX_DIMS = 32
MAX_COUNT = 1 << 53  # optimizer update counts: whole numbers a float64 holds exactly
MAX_CLIENT_STATE_DEPTH = 64  # lists/dicts inside client_state: plenty for a script's state, safe for the stack
_STATE_KEY = re.compile(r"state\.[A-Za-z_][A-Za-z0-9_]{0,63}")
_TOP = (
    ("tag", str),
    ("step", int),
    ("micro_steps", int),
    ("world_size", int),
    ("stage", int),
    ("params", list),
    ("fragments", dict),
    ("files", dict),
    ("optimizer", dict),
    ("loss_scaler", dict),
    ("rng", dict),
    ("client_state", dict),
    ("layout", dict),
)


def too_deep(value: Any, limit: int) -> str | None:
    """Where plain data `value` nests more than `limit` lists/dicts deep (a short path), else None. Iterative:
    data too deep for Python's stack (or holding itself) is told, never a RecursionError."""
    stack: list[tuple[Any, int, str]] = [(value, 0, "")]
    while stack:
        node, depth, where = stack.pop()
        if isinstance(node, (dict, list, tuple)) and depth >= limit:
            return (where if len(where) <= 60 else where[:57] + "...") or "the top"
        if isinstance(node, dict):
            stack += [(v, depth + 1, f"{where}.{str(k)[:20]}" if where else str(k)[:20]) for k, v in node.items()]
        elif isinstance(node, (list, tuple)):
            stack += [(v, depth + 1, f"{where}[{i}]") for i, v in enumerate(node)]
    return None


def _int(x: Any, lo: int = 0, hi: int = MAX_NUMEL) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and lo <= x <= hi


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def numel(shape: list[int]) -> int:
    return math.prod(shape)


def structure_problem(m: dict[str, Any]) -> str | None:
    """What is structurally wrong with manifest `m`, or None."""
    for key, kind in _TOP:
        if not isinstance(m.get(key), kind) or (kind is int and not _int(m[key])):
            return f"'{key}' missing or not a {kind.__name__}"
    try:  # a reshard writes a folder of this name: the same rule as a tag saved or passed
        plain_name(m["tag"], "tag")
    except CheckpointError:
        return f"tag {m['tag'][:40]!r} is not a plain folder name"
    if m["tag"] in POINTERS:
        return f"tag {m['tag']!r} is the name of a pointer file, not of a checkpoint folder"
    if not _int(m["world_size"], 1, 1 << 20) or not _int(m["stage"], 0, 3):
        return "world_size or stage out of range"
    return (
        _params_problem(m["params"])
        or _layout_problem(m)
        or _fragments_problem(m)
        or _files_problem(m)
        or _state_problem(m)
    )


def _params_problem(params: list[Any]) -> str | None:
    seen: dict[str, dict[str, Any]] = {}
    slots = []
    for p in params:
        if not (
            isinstance(p, dict)
            and isinstance(p.get("name"), str)
            and 0 < len(p["name"]) <= 4096
            and p["name"] != "__metadata__"  # safetensors' header entry: no tensor may take it
            and isinstance(p.get("shape"), list)
            and len(p["shape"]) <= MAX_DIMS
            and all(_int(d) for d in p["shape"])
            and numel(p["shape"]) <= MAX_NUMEL
            and isinstance(p.get("dtype"), str)
            and p["dtype"] in NAMES
            and isinstance(p.get("trainable"), bool)
            and (p.get("slot") is None or _int(p["slot"]))
            and (p.get("tied_to") is None or isinstance(p["tied_to"], str))
        ):
            return f"bad params entry {str(p)[:60]}"
        name = p["name"]
        if name in seen:
            return f"parameter {name!r} is listed twice"
        owner = seen.get(p["tied_to"]) if p.get("tied_to") is not None else None
        if p.get("tied_to") is not None:
            if owner is None or owner.get("tied_to") is not None:
                return f"{name!r} is tied to {p['tied_to']!r}, which is not an earlier untied entry"
            if owner["shape"] != p["shape"] or owner["dtype"] != p["dtype"] or owner["trainable"] != p["trainable"]:
                return f"{name!r} is tied to {p['tied_to']!r} but differs from it"
            if p.get("slot") is not None:
                return f"tied entry {name!r} has a slot of its own"
        elif p["trainable"]:
            if p.get("slot") is None or p["dtype"] not in FLOAT_NAMES:
                return f"trainable {name!r} has no slot or is not floating point"
            slots.append(p["slot"])
        elif p.get("slot") is not None:
            return f"frozen {name!r} has a slot"
        seen[name] = p
    if sorted(slots) != list(range(len(slots))):
        return "the trainable parameters' slots are not 0..N-1, each once"
    return None


def slot_shapes(m: dict[str, Any]) -> dict[int, list[int]]:
    """slot -> shape of its parameter (trainable, untied entries)."""
    return {p["slot"]: p["shape"] for p in m["params"] if p.get("slot") is not None}


def _layout_problem(m: dict[str, Any]) -> str | None:
    lay = m["layout"]
    if not (
        _int(lay.get("world_size"), 1, 1 << 20)
        and _int(lay.get("align"), 1, 1 << 30)
        and _int(lay.get("partition_numel"))
        and isinstance(lay.get("groups"), list)
    ):
        return "bad layout record"
    if lay["world_size"] not in (1, m["world_size"]) or (m["stage"] == 0 and lay["world_size"] != 1):
        return f"layout world size {lay['world_size']} does not fit world size {m['world_size']} at stage {m['stage']}"
    flat = [s for g in lay["groups"] if isinstance(g, list) for s in g]
    if len(flat) != sum(len(g) if isinstance(g, list) else -1 for g in lay["groups"]) or flat != list(
        range(len(slot_shapes(m)))
    ):
        return "layout groups do not list the slots 0..N-1 in order"
    return None


def _fragments_problem(m: dict[str, Any]) -> str | None:
    from .manifest import rank_file

    lay, shapes = m["layout"], slot_shapes(m)
    expected = {rank_file(r) for r in range(lay["world_size"])}
    if set(m["fragments"]) != expected:
        return f"fragment maps name {sorted(m['fragments'])[:3]} instead of the {lay['world_size']} rank file(s)"
    covered: dict[int, list[tuple[int, int]]] = {s: [] for s in shapes}
    for fname, frags in m["fragments"].items():
        if not isinstance(frags, list) or not all(
            isinstance(f, list) and len(f) == 4 and all(_int(x) for x in f) for f in frags
        ):
            return f"bad fragment map for {fname}"
        used = []
        for slot, start, offset, count in frags:
            if slot not in shapes or start + count > numel(shapes[slot]) or offset + count > lay["partition_numel"]:
                return f"fragment {[slot, start, offset, count]} of {fname} lies outside its parameter or partition"
            covered[slot].append((start, start + count))
            used.append((offset, offset + count))
        used.sort()
        if any(a[1] > b[0] for a, b in zip(used, used[1:])):
            return f"fragments of {fname} overlap in its partition"
    for slot, ranges in covered.items():
        ranges.sort()
        pos = 0
        for lo, hi in ranges:
            if lo != pos:
                return f"the fragments of slot {slot} do not cover its elements exactly once"
            pos = hi
        if pos != numel(shapes[slot]):
            return f"the fragments of slot {slot} cover {pos} of {numel(shapes[slot])} elements"
    return None


def _files_problem(m: dict[str, Any]) -> str | None:
    from .manifest import FROZEN_FILE

    expected = set(m["fragments"]) | {FROZEN_FILE}
    if set(m["files"]) != expected:
        extra = sorted(set(m["files"]) ^ expected)
        return f"the file list does not match the rank files and {FROZEN_FILE} (differs at {extra[0]!r})"
    for fname, meta in m["files"].items():
        problem = entry_problem(meta)
        if problem or not _int(meta["bytes"]):
            return f"bad file entry for {fname} ({problem or 'byte count out of range'})"
    from .manifest import partition_keys

    need = 8 + len(partition_keys(m)) * 4 * m["layout"]["partition_numel"]
    for fname in m["fragments"]:
        if m["files"][fname]["bytes"] < need:
            return f"{fname} is listed with {m['files'][fname]['bytes']} bytes, too few for its partition"
    return None


def _state_problem(m: dict[str, Any]) -> str | None:
    opt = m["optimizer"]
    keys = opt.get("state_keys", ["exp_avg", "exp_avg_sq"])
    if not (
        isinstance(keys, list)
        and len(keys) <= 32
        and len(set(keys)) == len(keys)
        and all(isinstance(k, str) and (k in ("exp_avg", "exp_avg_sq") or _STATE_KEY.fullmatch(k)) for k in keys)
    ):
        return "optimizer.state_keys is not a list of state names"
    scalars = opt.get("client_scalars", {})
    if not (isinstance(scalars, dict) and len(scalars) <= 32 and all(_number(v) for v in scalars.values())):
        return "optimizer.client_scalars is not a table of numbers"
    for key in ("applied", "skipped"):
        if not (_number(opt.get(key)) and 0 <= opt[key] <= MAX_COUNT and float(opt[key]).is_integer()):
            return f"optimizer.{key} is missing or not a whole number of updates in 0..2**53"
    lrs = opt.get("group_lrs")
    if lrs is not None and not (
        isinstance(lrs, list) and 0 < len(lrs) <= 1 << 16 and all(_number(v) and v >= 0 for v in lrs)
    ):
        return "optimizer.group_lrs is not a list of non-negative numbers"
    for key in ("lr", "eps", "weight_decay"):
        if opt.get(key) is not None and not _number(opt[key]):
            return f"optimizer.{key} is not a finite number"
    betas = opt.get("betas")
    if betas is not None and not (isinstance(betas, list) and len(betas) <= 4 and all(_number(b) for b in betas)):
        return "optimizer.betas is not a list of finite numbers"
    problem = _loss_scaler_problem(m["loss_scaler"]) or _scheduler_problem(m.get("scheduler", {}))
    if problem:
        return problem
    for rank, state in m["rng"].items():
        if not (isinstance(state, dict) and isinstance(state.get("torch"), str) and len(state["torch"]) < 1 << 16):
            return f"rng state of rank {rank!r} is not plain data"
    return None


def _whole(x: Any, lo: int) -> bool:
    return _number(x) and lo <= x <= MAX_COUNT and float(x).is_integer()


def _loss_scaler_problem(scaler: dict[str, Any]) -> str | None:
    """Numbers the scaler can run on: a scale of 0 would make every gradient infinite (each step skipped), a
    huge count overflow the schedule's arithmetic."""
    for key, value in scaler.items():
        v = value[0] if isinstance(value, list) and len(value) == 1 else value
        if not _number(v):
            return f"loss_scaler.{key!r} is not a number"
        if key == "cur_scale" and not 0 < v <= 2.0**126:  # its inverse stays a normal fp32
            return "loss_scaler.cur_scale is not a positive number up to 2**126"
        if key == "dynamic" and v not in (0, 1):
            return "loss_scaler.dynamic is not 0 or 1"
        if key in ("cur_iter", "cur_hysteresis", "min_scale_overflows", "last_overflow_iter") and not _whole(
                v, -1 if key == "last_overflow_iter" else 0):
            return f"loss_scaler.{key} is not a whole number of steps in range"
    return None


def _scheduler_problem(scheduler: Any) -> str | None:
    """DeepSpeed's position (`last_batch_iteration`, -1 before the first step, at the top or under
    `scheduler`) and a torch scheduler's `stepped` count are whole numbers a float64 holds exactly."""
    if not isinstance(scheduler, dict):
        return "'scheduler' is not an object"
    inner = scheduler.get("scheduler")
    for where, table in (("scheduler", scheduler), ("scheduler.scheduler", inner)):
        if isinstance(table, dict) and "last_batch_iteration" in table and not _whole(
                table["last_batch_iteration"], -1):
            return f"{where}.last_batch_iteration is not a whole number of steps in -1..2**53"
    if "stepped" in scheduler and not _whole(scheduler["stepped"], 0):
        return "scheduler.stepped is not a whole number of steps in 0..2**53"
    return None


# -- headers against the manifest -------------------------------------------------------------------


def expected_tensors(fname: str, m: dict[str, Any]) -> dict[str, tuple[str, list[int]]]:
    """name -> (dtype, shape) that file `fname` of the checkpoint must hold."""
    from .manifest import FROZEN_FILE

    if fname == FROZEN_FILE:
        return {p["name"]: (p["dtype"], p["shape"]) for p in m["params"] if not p["trainable"] and not p.get("tied_to")}
    from .manifest import partition_keys

    return {k: ("float32", [m["layout"]["partition_numel"]]) for k in partition_keys(m)}


def header_problem(path: Path, fname: str, m: dict[str, Any]) -> str | None:
    """Whether the safetensors header of `path` holds exactly the tensors the manifest lists for it."""
    from .safetensors_read import SafetensorsFile

    try:
        with SafetensorsFile(path) as f:
            found = {name: (NAME_OF_CODE[t["dtype"]], list(t["shape"])) for name, t in f.tensors.items()}
    except CheckpointError as e:
        return str(e).split("; ")[0]
    want = expected_tensors(fname, m)
    if found != want:
        diff = sorted(set(found) ^ set(want)) or sorted(k for k in want if found[k] != want[k])
        return f"{path} holds other tensors than its manifest lists (differs at {diff[0]!r})"
    return None
