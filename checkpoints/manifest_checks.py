"""Structural checks of a zbench manifest and of the files it describes.

A manifest is read from disk, so every value is checked against the others before anything trusts it:
types and ranges, slots against params, fragments against shapes (each trainable element stored exactly
once, inside its rank file's partition), rank files against the world size, and each safetensors header
against what the manifest says the file holds. Readers then never meet a KeyError, a negative offset or
a tensor of 10**24 elements. Each check returns a short problem text (None when sound).
"""

from __future__ import annotations

import math
import reprlib
from pathlib import Path
from typing import Any

from .checksums import entry_problem
from .manifest_state_checks import state_problem
from .dtypes import FLOAT_NAMES, NAME_OF_CODE, NAMES, TRAINING_NAMES
from .paths import plain_name
from .source import CheckpointError

POINTERS = ("latest", "latest_universal")  # files beside the tag folders

MAX_NUMEL = 1 << 48  # elements in one tensor or one partition: far beyond any model, far below overflow
MAX_DIMS = 32
MAX_CLIENT_STATE_DEPTH = 64  # lists/dicts inside client_state: plenty for a script's state, safe for the stack
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


def _int(x: Any, lo: int = 0, hi: int = MAX_NUMEL) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and lo <= x <= hi


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
    if m.get("dtype") not in TRAINING_NAMES:  # what the run trained in: any other name is no save of zbench
        return f"'dtype' is {reprlib.repr(m.get('dtype'))}, not one of {', '.join(TRAINING_NAMES)}"
    return (
        _params_problem(m["params"])
        or _excluded_problem(m)
        or _layout_problem(m)
        or _fragments_problem(m)
        or state_problem(m)  # before the files: their expected sizes count optimizer.state_keys
        or _files_problem(m)
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
            and isinstance(p.get("trainable"), bool)
            and (p.get("slot") is None or _int(p["slot"]))
            and (p.get("tied_to") is None or isinstance(p["tied_to"], str))
        ):
            return f"bad params entry {str(p)[:60]}"
        name = p["name"]
        if p["dtype"] not in NAMES:
            return f"bad params entry {name[:60]!r}: dtype {p['dtype'][:40]!r} is not one of {', '.join(NAMES)}"
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


def _excluded_problem(m: dict[str, Any]) -> str | None:
    """The frozen parameters a save left out: distinct names, none of them among the saved entries."""
    excluded = m.get("excluded", [])
    if not isinstance(excluded, list) or not all(isinstance(n, str) and 0 < len(n) <= 4096 for n in excluded):
        return "'excluded' is not a list of parameter names"
    if len(set(excluded)) != len(excluded) or set(excluded) & {p["name"] for p in m["params"]}:
        return "'excluded' names a parameter twice, or one the checkpoint saves"
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
