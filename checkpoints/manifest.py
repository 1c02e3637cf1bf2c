"""The zbench checkpoint manifest: the one place that builds, writes, reads and checks it.

Each tag folder holds `manifest.json` and, beside it, `manifest.sha256` (the `sha256sum` line of the
manifest's bytes, so `sha256sum -c manifest.sha256` works too). The manifest records:

    format, version, tag, step, micro_steps, world_size, stage, dtype
    layout      {world_size, align, partition_numel, groups: [[slot, ...], ...]}
    params      every state-dict entry saved: {name, shape, dtype, trainable, tied_to, slot}
    excluded    (only from a save with exclude_frozen_parameters=True) the frozen parameters left out, by name
    fragments   {rank file: [[slot, param_start, partition_offset, numel], ...]}: where each element lives
    files       {file name: {bytes, hash, digest}} for every rank file and frozen.safetensors (checksums.py)
    optimizer, loss_scaler, rng (per rank, plain data), client_state

Format versions: 1 kept Python's RNG state as its repr and had no checksum file (still read); 2 keeps
RNG states as plain lists and base64 strings and adds `manifest.sha256`; 3 names each file's checksum
algorithm (xxh3_128 by default, hashed while writing) where 1-2 recorded sha256 (still read). Nothing here evaluates or
unpickles anything: a manifest is JSON, checked field by field (manifest_checks.py) before use.
"""

from __future__ import annotations

import hashlib
import json
import os
import reprlib
from pathlib import Path
from typing import Any, Iterable

from . import checksums
from .dtypes import code_of, name_of
from .manifest_checks import structure_problem
from .paths import inside, read_regular
from .source import CheckpointError

FORMAT = "zbench-checkpoint"
VERSION = 3
MANIFEST = "manifest.json"
CHECKSUM = "manifest.sha256"
FROZEN_FILE = "frozen.safetensors"
PARTITION_KEYS = ("master", "exp_avg", "exp_avg_sq")
MAX_MANIFEST_BYTES = 1 << 30  # a manifest lists tensors and fragments, never tensor data


def _one_line(text: str, limit: int = 300) -> str:
    """A problem that quotes the file's own names and values, as one short printable line."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def partition_keys(manifest: dict[str, Any]) -> tuple[str, ...]:
    """The arrays every rank file holds: the fp32 master, then the optimizer's per-element states (Adam's
    moments unless the manifest says otherwise: a client optimizer's `state.<name>` arrays)."""
    return ("master", *manifest["optimizer"].get("state_keys", PARTITION_KEYS[1:]))


def rank_file(rank: int) -> str:
    return f"rank_{rank:05d}.safetensors"


# -- building ----------------------------------------------------------------------------------------
def param_entries(named: Iterable[tuple[str, Any]], slot_of: dict[int, int]) -> list[dict[str, Any]]:
    """Every state-dict entry (name, tensor): trainable ones point at their layout slot, tied names at the
    first name of the same tensor. `slot_of` maps id(parameter) to its slot in the flat layout."""
    first_name: dict[int, str] = {}
    entries = []
    for name, t in named:
        code_of(t.dtype, name)  # a dtype no file can hold is refused here, before anything is written
        entry: dict[str, Any] = {
            "name": name,
            "shape": list(t.shape),
            "dtype": name_of(t.dtype),
            "trainable": id(t) in slot_of,
            "tied_to": first_name.get(id(t)),
            "slot": None,
        }
        if entry["trainable"] and entry["tied_to"] is None:
            entry["slot"] = slot_of[id(t)]
        first_name.setdefault(id(t), name)
        entries.append(entry)
    return entries


def fragment_records(layout: Any) -> dict[str, list[list[int]]]:
    """The explicit fragment map of every rank file of `layout` (a checkpoints.layout.FlatLayout)."""
    return {
        rank_file(r): [[f.param_index, f.param_start, f.partition_offset, f.numel] for f in layout.fragments(r)]
        for r in range(layout.world_size)
    }


def layout_record(layout: Any) -> dict[str, Any]:
    return {
        "world_size": layout.world_size,
        "align": layout.align,
        "partition_numel": layout.partition_numel,
        "groups": [[s.index for s in g.slots] for g in layout.groups],
    }


def file_record(path: Path) -> dict[str, Any]:
    """What the manifest keeps of a file already on disk: its size and checksum (writers get it while writing)."""
    return checksums.file_record(path)


# -- writing and reading -----------------------------------------------------------------------------
def _fsynced_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write(folder: Path, manifest: dict[str, Any]) -> None:
    """manifest.json, then its checksum file; both fsynced."""
    problem = structure_problem(manifest)
    assert problem is None, f"refusing to write an inconsistent manifest: {problem}"
    data = json.dumps(manifest, indent=1).encode("utf-8")
    _fsynced_write(folder / MANIFEST, data)
    _fsynced_write(folder / CHECKSUM, f"{hashlib.sha256(data).hexdigest()}  {MANIFEST}\n".encode())


def _read_bounded(path: Path, limit: int) -> bytes:
    data = read_regular(path, limit)  # a FIFO or a folder is an OSError, never waited on
    if len(data) > limit:
        raise CheckpointError(
            f"{path} is larger than {limit} bytes, far more than any manifest; the checkpoint is "
            "damaged, use an earlier one"
        )
    return data


def read(folder: Path, follow_symlinks: bool = False) -> dict[str, Any]:
    """The manifest of tag folder `folder`, its checksum and its structure checked; CheckpointError otherwise."""
    path = inside(folder, MANIFEST, what="manifest", follow_symlinks=follow_symlinks)
    try:
        raw = _read_bounded(path, MAX_MANIFEST_BYTES)
        manifest = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys)
    except _DuplicateKey as e:
        raise CheckpointError(
            f"{path} gives the key {_one_line(reprlib.repr(e.key), 60)} twice in one object, so readers may disagree "
            "on its value; the manifest was edited or damaged, use an earlier tag"
        ) from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CheckpointError(
            f"{path} is unreadable ({e.__class__.__name__}); the checkpoint is damaged, use an earlier tag"
        ) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a zbench manifest; pass a zbench checkpoint or use --from")
    version = manifest.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= VERSION:
        shown = _one_line(reprlib.repr(version), 40)  # reprlib bounds each level, not the whole
        raise CheckpointError(
            f"{folder} uses checkpoint format {shown}, not one this zbench (formats 1-{VERSION}) reads; upgrade zbench"
        )
    if version >= 2:
        _check_checksum(folder, raw, follow_symlinks)
    problem = structure_problem(manifest)
    if problem:
        raise CheckpointError(f"{path} is damaged ({_one_line(problem)}); use an earlier checkpoint")
    return manifest


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object as a dict; a key given twice is refused (json keeps the last, other readers the first)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _check_checksum(folder: Path, raw: bytes, follow_symlinks: bool) -> None:
    path = inside(folder, CHECKSUM, what="manifest checksum", follow_symlinks=follow_symlinks)
    try:
        text = _read_bounded(path, 4096).decode("ascii", "replace").split()
    except FileNotFoundError:
        raise CheckpointError(
            f"{path} is missing, so edits to {folder / MANIFEST} cannot be detected; restore it "
            "from where the checkpoint was saved, or use an earlier checkpoint"
        ) from None
    except OSError as e:
        raise CheckpointError(f"cannot read {path} ({e.strerror}); restore it or use an earlier checkpoint") from None
    if not text or text[0] != hashlib.sha256(raw).hexdigest():
        raise CheckpointError(
            f"{folder / MANIFEST} does not match its checksum in {CHECKSUM}: it was edited or damaged "
            "after the save; restore it or use an earlier checkpoint"
        )
    if text[1:] not in ([MANIFEST], ["*" + MANIFEST]):  # sha256sum's one line: text or binary mode
        raise CheckpointError(
            f"{path} holds more than the sha256sum line of {MANIFEST}: it was edited or damaged after the save; "
            "restore it or use an earlier checkpoint"
        )


# -- checking the files it lists ---------------------------------------------------------------------
def verify_files(
    folder: Path, manifest: dict[str, Any], names: list[str] | None = None, follow_symlinks: bool = False
) -> list[str]:
    """Problems with the listed files (all by default): a link, missing, wrong size, checksum mismatch or a
    safetensors header that disagrees with the manifest."""
    from .manifest_checks import header_problem

    problems = []
    for name, meta in manifest["files"].items():
        if names is not None and name not in names:
            continue
        p = inside(folder, name, what="checkpoint file", follow_symlinks=follow_symlinks)  # a refusal, not damage
        try:
            if not p.is_file():
                problems.append(f"{p} is missing")
            elif p.stat().st_size != meta["bytes"]:
                problems.append(f"{p} is truncated or padded ({p.stat().st_size} bytes, manifest says {meta['bytes']})")
            elif checksums.file_digest(p, checksums.expected(meta)[0]) != checksums.expected(meta)[1]:
                problems.append(f"{p} fails its {checksums.expected(meta)[0]} checksum (corrupted)")
            else:
                problem = header_problem(p, name, manifest)
                if problem:
                    problems.append(problem)
        except CheckpointError as e:
            problems.append(str(e).split("; ")[0])
        except FileNotFoundError:
            problems.append(
                f"{folder / name} disappeared while it was read (another process removed this checkpoint, "
                "e.g. a save with keep_last)"
            )
        except OSError as e:
            problems.append(f"{folder / name} cannot be read ({e.strerror})")
    return problems


def check_files(
    folder: Path, manifest: dict[str, Any], names: list[str] | None = None, follow_symlinks: bool = False
) -> None:
    """Raise a one-line CheckpointError naming the first damaged file."""
    problems = verify_files(folder, manifest, names, follow_symlinks)
    if problems:
        raise CheckpointError(f"{problems[0]}; restore it or load an earlier checkpoint")
