"""zbench's native checkpoint: a folder per tag with `manifest.json` and one safetensors file per rank.

    ROOT/latest                      the newest complete tag (moved only after a complete save)
    ROOT/<tag>/manifest.json         step, world size, stage, every parameter, explicit fragment maps,
                                     optimizer hyper-parameters and counters, RNG, client state, sha256 per file
    ROOT/<tag>/rank_00000.safetensors   that rank's flat partitions: master, exp_avg, exp_avg_sq (fp32)
    ROOT/<tag>/frozen.safetensors       frozen parameters and buffers (replicated, written by rank 0)

A save writes into ROOT/.<tag>.partial and renames it to ROOT/<tag> once the manifest is in, so a
crash mid-save never damages an earlier checkpoint. This module is pure file handling: it imports
only torch and safetensors, so converters run without the engine.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from .source import CheckpointError

FORMAT = "zbench-checkpoint"
VERSION = 1
MANIFEST = "manifest.json"
LATEST = "latest"
FROZEN_FILE = "frozen.safetensors"
PARTITION_KEYS = ("master", "exp_avg", "exp_avg_sq")


def rank_file(rank: int) -> str:
    return f"rank_{rank:05d}.safetensors"


def partial_dir(root: Path, tag: str) -> Path:
    return root / f".{tag}.partial"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def fsync_path(path: Path) -> None:
    """Flush a file or a directory entry to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def commit(root: Path, tag: str) -> None:
    """Publish ROOT/.<tag>.partial as ROOT/<tag>, then point `latest` at it (rank 0 only)."""
    staged, final = partial_dir(root, tag), root / tag
    fsync_path(staged)
    old = root / f".{tag}.old"
    if final.exists():  # re-saving a tag: swap, then drop the old copy
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(staged, final)
    fsync_path(root)
    tmp = root / (LATEST + ".tmp")
    tmp.write_text(tag + "\n", encoding="utf-8")
    fsync_path(tmp)
    os.replace(tmp, root / LATEST)
    fsync_path(root)
    shutil.rmtree(old, ignore_errors=True)


def complete_tags(root: Path) -> list[tuple[int, str]]:
    """(step, tag) of every complete checkpoint under root, oldest first."""
    out = []
    for d in root.iterdir() if root.is_dir() else []:
        if d.is_dir() and not d.name.startswith(".") and (d / MANIFEST).is_file():
            try:
                out.append((int(json.loads((d / MANIFEST).read_text(encoding="utf-8"))["step"]), d.name))
            except (ValueError, KeyError, json.JSONDecodeError):
                continue
    return sorted(out)


def prune(root: Path, keep_last: int) -> list[str]:
    """Delete all but the newest `keep_last` complete checkpoints; never the one `latest` names."""
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    latest = read_latest(root)
    tags = complete_tags(root)
    removed = []
    for _, tag in tags[: max(0, len(tags) - keep_last)]:
        if tag != latest:
            shutil.rmtree(root / tag)
            removed.append(tag)
    return removed


def read_latest(root: Path) -> str | None:
    p = root / LATEST
    return p.read_text(encoding="utf-8").strip() if p.is_file() else None


def resolve(path: str | os.PathLike, tag: str | None = None) -> Path:
    """The checkpoint folder for `path` (a root with `latest`, or a tag folder itself) and `tag`."""
    root = Path(path)
    if not root.exists():
        raise CheckpointError(f"checkpoint path {root} does not exist; pass the folder given to save_checkpoint")
    if tag is None and (root / MANIFEST).is_file():
        return root
    if tag is None:
        tag = read_latest(root)
        if tag is None:
            raise CheckpointError(f"{root} has no '{LATEST}' file and no {MANIFEST}; pass --tag or a checkpoint folder")
    folder = root / tag
    if not (folder / MANIFEST).is_file():
        present = ", ".join(t for _, t in complete_tags(root)) or "none"
        raise CheckpointError(f"no complete checkpoint '{tag}' in {root} (tags present: {present}); pick one of those")
    return folder


def read_manifest(folder: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{folder / MANIFEST} is unreadable ({e.__class__.__name__}); the checkpoint is damaged, use an earlier tag")
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{folder / MANIFEST} is not a zbench manifest; pass a zbench checkpoint or use --from")
    if not isinstance(manifest.get("version"), int) or manifest["version"] > VERSION:
        raise CheckpointError(f"{folder} uses checkpoint format {manifest.get('version')!r}, not one this zbench ({VERSION}) reads; upgrade zbench")
    problem = _shape_problem(manifest)
    if problem:
        raise CheckpointError(f"{folder / MANIFEST} is damaged ({problem}); use an earlier checkpoint")
    return manifest


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _shape_problem(m: dict[str, Any]) -> str | None:
    """What is structurally wrong with a manifest, so readers never meet a KeyError or TypeError."""
    for key, kind in (("tag", str), ("step", int), ("micro_steps", int), ("world_size", int), ("stage", int),
                      ("params", list), ("fragments", dict), ("files", dict), ("optimizer", dict),
                      ("loss_scaler", dict), ("rng", dict), ("client_state", dict), ("layout", dict)):
        if not isinstance(m.get(key), kind) or (kind is int and not _is_int(m[key])):
            return f"'{key}' missing or not a {kind.__name__}"
    for p in m["params"]:
        if not (isinstance(p, dict) and isinstance(p.get("name"), str) and isinstance(p.get("shape"), list)
                and all(_is_int(d) and d >= 0 for d in p["shape"]) and isinstance(p.get("dtype"), str)
                and isinstance(p.get("trainable"), bool) and (p.get("slot") is None or _is_int(p["slot"]))
                and (p.get("tied_to") is None or isinstance(p["tied_to"], str))):
            return f"bad params entry {str(p)[:60]}"
    for fname, frags in m["fragments"].items():
        if "/" in fname or fname.startswith("."):
            return f"file name {fname!r} points outside the checkpoint"
        if not isinstance(frags, list) or not all(isinstance(f, list) and len(f) == 4 and all(_is_int(x) and x >= 0 for x in f)
                                                  for f in frags):
            return f"bad fragment map for {fname}"
    for fname, meta in m["files"].items():
        if not (isinstance(meta, dict) and isinstance(meta.get("sha256"), str) and _is_int(meta.get("bytes"))):
            return f"bad file entry for {fname}"
        if "/" in fname or fname.startswith("."):
            return f"file name {fname!r} points outside the checkpoint"
    return None


def verify_files(folder: Path, manifest: dict[str, Any], names: list[str] | None = None) -> list[str]:
    """Problems with the listed files (all by default): missing, wrong size, or sha256 mismatch."""
    problems = []
    for name, meta in manifest["files"].items():
        if names is not None and name not in names:
            continue
        p = folder / name
        if not p.is_file():
            problems.append(f"{p} is missing")
        elif p.stat().st_size != meta["bytes"]:
            problems.append(f"{p} is truncated or padded ({p.stat().st_size} bytes, manifest says {meta['bytes']})")
        elif sha256_file(p) != meta["sha256"]:
            problems.append(f"{p} fails its sha256 checksum (corrupted)")
    return problems


def check_files(folder: Path, manifest: dict[str, Any], names: list[str] | None = None) -> None:
    """Raise a one-line CheckpointError naming the first damaged file."""
    problems = verify_files(folder, manifest, names)
    if problems:
        raise CheckpointError(f"{problems[0]}; restore it or load an earlier checkpoint")
