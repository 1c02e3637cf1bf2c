"""Reading zbench checkpoints by parameter: the fragment index and the converter-facing source."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from . import manifest as mf
from . import zbench_format as fmt
from .manifest_checks import header_problem
from .paths import inside
from .safetensors_read import SafetensorsFile
from .source import CheckpointError, ParamInfo, SourceSummary
from .verified_read import Span, read_verified


class FragmentReader:
    """Reads any element range of any saved parameter, opening only the rank files that hold it."""

    def __init__(self, folder: Path, manifest: dict[str, Any], follow_symlinks: bool = False) -> None:
        self.folder, self.manifest, self.follow_symlinks = folder, manifest, follow_symlinks
        self.by_param: dict[int, list[tuple[str, int, int, int]]] = defaultdict(list)
        for fname, frags in manifest["fragments"].items():
            for index, param_start, offset, numel in frags:
                self.by_param[index].append((fname, param_start, offset, numel))
        self.index_of = {p["name"]: i for i, p in enumerate(manifest["params"]) if p.get("slot") is not None}
        self._handles: dict[str, SafetensorsFile] = {}

    def _handle(self, fname: str) -> SafetensorsFile:
        """The open rank file, its header checked against the manifest when first opened."""
        if fname not in self._handles:
            path = inside(self.folder, fname, what="rank file", follow_symlinks=self.follow_symlinks)
            problem = header_problem(path, fname, self.manifest) if path.is_file() else f"{path} is missing"
            if problem:
                raise CheckpointError(f"{problem}; restore it or use an earlier checkpoint")
            self._handles[fname] = SafetensorsFile(path)
        return self._handles[fname]

    def check_header(self, fname: str) -> None:
        """CheckpointError unless rank file `fname` is present, inside the folder and its header as listed."""
        self._handle(fname)

    def files_for(self, names: list[str]) -> list[str]:
        """Rank files that hold any element of these parameters."""
        return sorted({f for n in names for f, *_ in self.by_param[self.manifest["params"][self.index_of[n]]["slot"]]})

    def _pieces(self, name: str, start: int, count: int) -> list[tuple[str, int, int, int]]:
        """(rank file, element offset in its partition, lo, hi): where elements [start, start + count) of
        parameter `name` lie; lo..hi counted from `start`."""
        slot = self.manifest["params"][self.index_of[name]]["slot"]
        end = start + count
        out = []
        for fname, p_start, offset, numel in self.by_param[slot]:
            lo, hi = max(start, p_start), min(end, p_start + numel)
            if lo < hi:
                out.append((fname, offset + lo - p_start, lo - start, hi - start))
        if sum(hi - lo for *_, lo, hi in out) != count:
            raise CheckpointError(
                f"{self.folder}: the fragments of {name} do not cover its elements; the manifest is damaged"
            )
        return out

    def read_into(self, out: torch.Tensor, name: str, key: str, start: int) -> None:
        """Fill `out` (flat) with elements [start, start + out.numel()) of parameter `name`'s `key` partition."""
        for fname, offset, lo, hi in self._pieces(name, start, out.numel()):
            try:
                self._handle(fname).read_into(key, offset, out[lo:hi])
            except FileNotFoundError:
                raise CheckpointError(
                    f"{self.folder / fname} disappeared while it was read (another process removed this "
                    "checkpoint, e.g. a save with keep_last); read a newer one"
                ) from None

    def spans(self, out: torch.Tensor, name: str, key: str, start: int) -> list[tuple[str, Span]]:
        """Like read_into, but say which bytes of which file go where (for one verified pass per file)."""
        return [
            (fname, Span(self._handle(fname).byte_offset(key, offset), out[lo:hi].view(torch.uint8)))
            for fname, offset, lo, hi in self._pieces(name, start, out.numel())
        ]

    def close(self) -> None:
        for h in self._handles.values():
            h.close()
        self._handles.clear()


class ZbenchSource:
    """`CheckpointSource` over a zbench checkpoint folder (fp32 masters, frozen tensors as stored)."""

    def __init__(self, path: str | Path, tag: str | None = None, follow_symlinks: bool = False) -> None:
        self.follow_symlinks = follow_symlinks
        self.folder = fmt.resolve(path, tag, follow_symlinks)
        self.identity = fmt.folder_identity(self.folder)  # before the manifest: a re-save after it is seen (read_guard)
        self.manifest = mf.read(self.folder, follow_symlinks)
        self.reader = FragmentReader(self.folder, self.manifest, follow_symlinks)
        self.buffer_names = buffer_names(self.manifest)

    def params(self) -> list[ParamInfo]:
        return [
            ParamInfo(p["name"], tuple(p["shape"]), p["dtype"], p["trainable"], p.get("tied_to"))
            for p in self.manifest["params"]
        ]

    def load(self, name: str) -> torch.Tensor:
        entry = next((p for p in self.manifest["params"] if p["name"] == name), None)
        if entry is None:
            raise CheckpointError(f"{name!r} is not in {self.folder}; `zbench inspect` lists the parameters")
        if entry.get("tied_to"):
            return self.load(entry["tied_to"])
        if not entry["trainable"]:
            t = read_frozen(self.folder, self.manifest, [name], self.follow_symlinks)[name]
            return t.float() if t.is_floating_point() else t
        out = torch.empty(int(torch.Size(entry["shape"]).numel()), dtype=torch.float32)
        self.reader.read_into(out, name, "master", 0)
        return out.view(entry["shape"])

    def summary(self) -> SourceSummary:
        m = self.manifest
        dtypes: dict[str, int] = defaultdict(int)
        for p in m["params"]:
            if not p.get("tied_to"):
                dtypes[p["dtype"]] += int(torch.Size(p["shape"]).numel())
        size = sum(meta["bytes"] for meta in m["files"].values())
        return SourceSummary(
            "zbench",
            str(self.folder),
            m["step"],
            m["stage"],
            m["world_size"],
            sum(dtypes.values()),
            dict(dtypes),
            size,
            {"tag": m["tag"], "format_version": m["version"],
             **({"left out by the save": f"{len(m['excluded'])} frozen parameters (exclude_frozen_parameters)"}
                if "excluded" in m else {})},
        )

    def verify(self) -> list[str]:
        return mf.verify_files(self.folder, self.manifest, follow_symlinks=self.follow_symlinks)


def buffer_names(manifest: dict[str, Any]) -> set[str] | None:
    """The saved entries that are buffers, not frozen parameters (the manifest's `buffers`), or None for a
    checkpoint of an older zbench, which did not record them. A list that is not distinct names of saved
    untrained entries is one CheckpointError line."""
    if "buffers" not in manifest:
        return None
    names = manifest["buffers"]
    untrained = {p["name"] for p in manifest["params"] if not p["trainable"]}
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names) or len(set(names)) != len(names) \
            or not set(names) <= untrained:
        raise CheckpointError("the manifest's 'buffers' is not a list of distinct names of saved untrained entries; "
                              "the manifest is damaged: restore it or use an earlier checkpoint")
    return set(names)


def read_frozen(
    folder: Path, manifest: dict[str, Any], names: list[str], follow_symlinks: bool = False, verify: bool = False
) -> dict[str, torch.Tensor]:
    """The frozen tensors `names` from frozen.safetensors, its header checked against the manifest first;
    `verify`: the whole file read once and its checksum checked on the way."""
    path = inside(folder, mf.FROZEN_FILE, what="frozen tensors file", follow_symlinks=follow_symlinks)
    problem = header_problem(path, mf.FROZEN_FILE, manifest) if path.is_file() else f"{path} is missing"
    if problem:
        raise CheckpointError(f"{problem}; restore it or use an earlier checkpoint")
    with SafetensorsFile(path) as f:
        if not verify:
            return {n: f.read(n) for n in names}
        out = {n: torch.empty(f.tensors[n]["shape"], dtype=f.dtype(n)) for n in names}
        spans = [Span(f.byte_offset(n, 0), t.view(-1).view(torch.uint8)) for n, t in out.items()]
    read_verified(path, manifest["files"][mf.FROZEN_FILE], spans)
    return out
