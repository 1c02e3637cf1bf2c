"""`load_pretrained(engine, folder)`: a Hugging Face safetensors folder into an engine, each rank reading
only what it keeps.

The folder holds `model.safetensors`, or shards named by `model.safetensors.index.json`'s weight_map
(every file named there must lie inside the folder: checkpoints/paths.py). Names map strictly: every
tensor of `module.state_dict()` must be in the files under one of its names (tied weights need one), and
every tensor in the files must be the model's; otherwise one ValueError lists what is missing and what is
unexpected. Trainable parameters: each rank reads only the element ranges of its own shards (positioned
reads, checkpoints/safetensors_read.py), assembles them into the optimizer's fp32 masters chunk by chunk
(deferred/shards.py) and the working weights are refreshed from them. Frozen parameters and persistent
buffers are read whole on every rank (they are replicated). Memory stays near one chunk plus one piece.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from checkpoints.paths import inside, read_regular
from checkpoints.safetensors_read import SafetensorsFile

from .deferred.shards import assembler_for

if TYPE_CHECKING:
    from .engine import Engine

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
MAX_INDEX_BYTES = 64 << 20


def _link_root(folder: Path) -> Path:
    """Where links in `folder` may point: the folder itself, or for a Hugging Face hub cache snapshot
    (.../models--ORG--NAME/snapshots/REV[/SUB]) the whole models--*/ folder, whose blobs/ the snapshot links into."""
    real = folder.resolve()
    for up in (real, *real.parents):
        if up.name == "snapshots" and up.parent.name.startswith("models--"):
            return up.parent
    return real


def _weight_file(folder: Path, rel: str, what: str) -> Path:
    """folder/rel, a regular file whose real location lies in `_link_root(folder)`; ValueError otherwise. Links
    are followed the same way for an index, its shards and a single model.safetensors (weights are only read)."""
    path = inside(folder, rel, what=what, follow_symlinks=True)  # no absolute name, no '..'
    real, root = path.resolve(), _link_root(folder)
    if not real.is_relative_to(root):
        raise ValueError(f"{what} {path} links to {real}, outside {root}; pretrained= reads links only within the "
                         f"folder (or a hub cache's models--*/ folder): copy the files into one folder "
                         f"(cp -rL {folder} NEW) and pass NEW")
    if not real.is_file():
        raise ValueError(f"{what} {path} is not a regular file; point at a folder written by save_pretrained")
    return path


def _files_by_name(folder: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it."""
    if os.path.lexists(folder / INDEX):
        index = _weight_file(folder, INDEX, "weight index")
        fix = "write the folder with save_pretrained"
        try:
            raw = read_regular(index, MAX_INDEX_BYTES)
            if len(raw) > MAX_INDEX_BYTES:
                raise ValueError(f"{index} is larger than {MAX_INDEX_BYTES} bytes; it is not a weight index")
            weight_map = json.loads(raw.decode("utf-8"))["weight_map"]
        except RecursionError:
            raise ValueError(f"{index} is nested too deeply to be a safetensors index; {fix}") from None
        except OSError as e:
            raise ValueError(f"cannot read {index} ({e.strerror}); {fix}") from None
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            raise ValueError(f"{index} is not a safetensors index (JSON with a weight_map); {fix}") from None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ValueError(f"{index}: weight_map must map tensor names to file names")
        files = {rel: _weight_file(folder, rel, "weight file") for rel in dict.fromkeys(weight_map.values())}
        return {name: files[rel] for name, rel in weight_map.items()}
    if os.path.lexists(folder / SINGLE):
        single = _weight_file(folder, SINGLE, "weight file")
        with SafetensorsFile(single) as f:
            return {name: single for name in f.tensors}
    raise ValueError(f"{folder} has neither {SINGLE} nor {INDEX}; point at a folder written by save_pretrained "
                     "(safetensors)")


def _match(engine: "Engine", in_files: set[str]) -> dict[int, tuple[str, torch.Tensor]]:
    """id(tensor) -> (the name it is read under, the model's tensor), or one ValueError naming every mismatch."""
    names: dict[int, list[str]] = {}
    tensors: dict[int, torch.Tensor] = {}
    for name, t in engine.module.state_dict(keep_vars=True).items():
        names.setdefault(id(t), []).append(name)
        tensors[id(t)] = t
    missing = [ns[0] for ns in names.values() if not any(n in in_files for n in ns)]
    known = {n for ns in names.values() for n in ns}
    unexpected = sorted(in_files - known)
    if missing or unexpected:
        raise ValueError(f"the pretrained weights do not match the model: missing {sorted(missing)[:20]} "
                         f"({len(missing)}), unexpected {unexpected[:20]} ({len(unexpected)}); load a checkpoint of "
                         "this architecture")
    return {key: (next(n for n in ns if n in in_files), tensors[key]) for key, ns in names.items()}


class _Files:
    """Open safetensors files, each opened once, checked, and closed at the end."""

    def __init__(self) -> None:
        self.open: dict[Path, SafetensorsFile] = {}

    def __call__(self, path: Path) -> SafetensorsFile:
        if path not in self.open:
            self.open[path] = SafetensorsFile(path)
        return self.open[path]

    def close(self) -> None:
        for f in self.open.values():
            f.close()


def _read(f: SafetensorsFile, name: str, start: int, numel: int) -> torch.Tensor:
    out = torch.empty(numel, dtype=f.dtype(name))
    f.read_into(name, start, out)
    return out


def load_pretrained(engine: "Engine", folder: str | os.PathLike) -> None:
    """Collective: load a Hugging Face safetensors folder's weights into `engine` (call it right after
    `initialize`: the optimizer's moments are not touched)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"pretrained folder {folder} does not exist; point at a folder written by save_pretrained")
    where = _files_by_name(folder)
    matched = _match(engine, set(where))
    files = _Files()
    try:
        for key, (name, t) in matched.items():  # shapes first: nothing changes unless everything fits
            f = files(where[name])
            if name not in f.tensors:
                raise ValueError(f"{where[name]} has no tensor {name!r} although the index names it there; "
                                 "write the folder again with save_pretrained")
            if tuple(f.tensors[name]["shape"]) != tuple(t.shape):
                raise ValueError(f"{name} is {tuple(f.tensors[name]['shape'])} in {where[name]} but "
                                 f"{tuple(t.shape)} in the model; load a checkpoint of this configuration")
        engine.wait_for_weights()
        layout, rank = engine.layout, engine.rank if engine.layout.world_size > 1 else 0
        slot = {id(p): i for i, p in enumerate(engine.params)}
        assembler = assembler_for(layout, rank, engine.optimizer.states)
        with torch.no_grad():
            for piece in layout.fragments(rank):
                name, _ = matched[id(engine.params[piece.param_index])]
                values = _read(files(where[name]), name, piece.param_start, piece.numel)
                assembler.put_piece(piece.partition_offset, values.float())
            assembler.close()
            for key, (name, t) in matched.items():
                if key not in slot:  # frozen parameters and buffers: replicated, whole
                    f = files(where[name])
                    t.data.copy_(_read(f, name, 0, f.numel(name)).view(t.shape).to(t.dtype))
        engine.refresh_working_weights()
    finally:
        files.close()
