"""Offline reshard of a zbench checkpoint for M ranks (`zbench convert SRC --to zbench --world-size M`).

Resuming never needs this (load reshards on the fly); it exists to hand a run to a machine where
reading N files per rank is unwanted. Each new rank file is streamed element range by element range,
so memory stays near one fragment, not one partition.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any, Iterable

import torch

from . import manifest as mf
from . import zbench_format as fmt
from .layout import build_layout
from .output_claim import claimed_output
from .paths import inside
from .read_guard import MIXED, FolderWatch
from .safetensors_stream import StreamingWriter
from .source import CheckpointError
from .zbench_source import FragmentReader, ZbenchSource

_CHUNK = 1 << 24  # elements per read: bounds memory for very large fragments
MAX_WORLD = 1 << 16  # ranks of a resharded checkpoint: far past any run, and a file per rank


def check_world_size(world_size: int) -> None:
    """Refuse a world size past MAX_WORLD (a rank file each) before anything is read or written."""
    if world_size > MAX_WORLD:
        raise CheckpointError(
            f"--world-size {world_size} is more than {MAX_WORLD} ranks (one file each); pass --world-size "
            f"{MAX_WORLD} or fewer"
        )


def reshard_to_zbench(source: object, out: str | Path, world_size: int, protect: Iterable[str | Path] = ()) -> Path:
    """Write `source` (a zbench checkpoint) as a checkpoint laid out for `world_size` ranks under `out`.

    `out` must be new or empty and outside the source's folder and the `protect` folders."""
    if not isinstance(source, ZbenchSource):
        raise CheckpointError("--to zbench reshards zbench checkpoints only; convert other kinds with --to fp32")
    if world_size < 1:
        raise CheckpointError(f"--world-size must be >= 1, got {world_size}")
    check_world_size(world_size)
    out = Path(out)
    protect = [*protect, source.folder]
    m = source.manifest
    trainable = sorted((p for p in m["params"] if p.get("slot") is not None), key=lambda p: p["slot"])
    elements = sum(math.prod(p["shape"]) for p in trainable)
    if m["stage"] != 0 and world_size > max(elements, 1):
        raise CheckpointError(
            f"--world-size {world_size} is more ranks than this checkpoint has trainable elements to shard "
            f"({elements}); pass --world-size {max(elements, 1)} or fewer"
        )
    bounds = [group[0] for group in m["layout"]["groups"]]
    new_world = 1 if m["stage"] == 0 else world_size  # stage 0 keeps one replicated copy; a 1-rank save splits
    layout = build_layout(
        [(p["name"], p["shape"]) for p in trainable], new_world, group_bounds=bounds, align=m["layout"]["align"]
    )
    tag = m["tag"]
    watch = FolderWatch(source)  # a save of the same tag may rename a new folder in while this reads
    with claimed_output(out, protect) as root:  # a full disk or a refused write leaves nothing behind
        staged = fmt.staging_dir(root, tag, fmt.new_token())
        staged.mkdir()
        try:
            _write(source, layout, world_size, new_world, staged, root, tag)
        except (CheckpointError, OSError):  # a file of the replaced folder may be gone: say so, not "damaged"
            watch.check(MIXED)
            raise
        watch.check(MIXED)  # before the output is published: its pieces may come from two checkpoints
    return out / tag


def _write(
    source: ZbenchSource, layout: Any, world_size: int, new_world: int, staged: Path, out: Path, tag: str
) -> None:
    """Stream every new rank file, the frozen tensors and the manifest into `staged`, then commit."""
    m = source.manifest
    reader = FragmentReader(source.folder, m, source.follow_symlinks)
    files = {}
    try:
        for r in range(new_world):
            name = mf.rank_file(r)
            frags = layout.fragments(r)
            keys = mf.partition_keys(m)
            w = StreamingWriter(staged / name, [(k, torch.float32, [layout.partition_numel]) for k in keys])
            for key in keys:
                pos = 0
                for f in frags:
                    if f.partition_offset > pos:  # alignment padding between fragments
                        w.write(torch.zeros(f.partition_offset - pos))
                    for lo in range(0, f.numel, _CHUNK):
                        piece = torch.empty(min(_CHUNK, f.numel - lo))
                        reader.read_into(piece, f.name, key, f.param_start + lo)
                        w.write(piece)
                    pos = f.partition_offset + f.numel
                w.write(torch.zeros(layout.partition_numel - pos))
            files[name] = w.close()
    finally:
        reader.close()
    frozen = inside(source.folder, mf.FROZEN_FILE, what="frozen tensors file", follow_symlinks=source.follow_symlinks)
    shutil.copy2(frozen, staged / mf.FROZEN_FILE)
    files[mf.FROZEN_FILE] = m["files"][mf.FROZEN_FILE]
    manifest = {
        **m,
        "version": mf.VERSION,
        "world_size": world_size,
        "rng": {},
        "files": files,
        "layout": mf.layout_record(layout),
        "fragments": mf.fragment_records(layout),
    }
    mf.write(staged, manifest)
    fmt.commit(out, tag, staged)
