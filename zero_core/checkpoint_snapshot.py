"""What one rank's save writes, file by file, and the reusable host buffers an async save copies it into; which
files of a checkpoint folder no save wrote (a re-save of its tag and keep_last leave such a folder alone).

A synchronous save writes straight from the live tensors (training waits anyway). An async save first
copies every tensor it will write into host buffers kept across saves (pinned on CUDA, copied on a side
stream), so training may change the live tensors while a background thread writes the copies. States on
NVMe are streamed into the buffers chunk by chunk; a synchronous save streams them to the file instead.

Pinning gigabytes of host memory takes seconds (8.58 GiB: 7.8 s on an H100 host), so with
`zero_core.async_checkpoint` set the engine reserves the buffers on a thread of their own as it starts
(`reserve_for`): the first async save then finds them made, as every later save does.
"""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from checkpoints import manifest as mf
from checkpoints.paths import one_line
from checkpoints.tag_folder import TagNotReplaceable

from . import worker_threads
from .optim.client_optimizer import ClientOptimizer
from .optim.states import NAMES, TensorStates
from .pinned import empty_pinned

if TYPE_CHECKING:
    from .engine import Engine


def _host_tensor(shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    return empty_pinned(shape, dtype) if torch.cuda.is_available() else torch.empty(shape, dtype=dtype)


class NvmeStates:
    """A rank file whose states live on NVMe: written by streaming them chunk by chunk."""

    def __init__(self, states: Any) -> None:
        self.states = states


class HostBuffers:
    """Host copies of the tensors a save writes, reused by the next save of the same shapes."""

    def __init__(self) -> None:
        self._bufs: dict[str, torch.Tensor] = {}
        self._stream: Any = None
        self._reserving: threading.Thread | None = None

    def reserve(self, specs: list[tuple[str, torch.Size, torch.dtype]]) -> None:
        """Make the buffers of `specs` on a background thread; the first use waits for it. A buffer it could not
        make (host memory) is simply made, or refused, at the save that needs it."""

        def make() -> None:
            for key, shape, dtype in specs:
                try:
                    self._bufs[key] = _host_tensor(shape, dtype)
                except RuntimeError:
                    return

        self._reserving = worker_threads.start(make, "zero_core-checkpoint-buffers")

    def _ready(self) -> None:
        if self._reserving is not None:
            self._reserving.join()
            self._reserving = None

    @property
    def nbytes(self) -> int:
        self._ready()
        return sum(b.numel() * b.element_size() for b in self._bufs.values())

    def _buffer(self, key: str, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        self._ready()
        buf = self._bufs.get(key)
        if buf is None or buf.shape != shape or buf.dtype != dtype:
            self._bufs.pop(key, None)  # freed before the new one is made
            buf = _host_tensor(shape, dtype)
            self._bufs[key] = buf
        return buf

    def copy(self, tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
        """Host copies of `tensors`; device tensors are copied on a side stream, finished before returning."""
        out = {k: self._buffer(f"{prefix}/{k}", t.shape, t.dtype) for k, t in tensors.items()}
        if any(t.is_cuda for t in tensors.values()):
            self._stream = self._stream or torch.cuda.Stream()
            self._stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self._stream):
                for k, t in tensors.items():
                    out[k].copy_(t.detach(), non_blocking=True)
            self._stream.synchronize()
        else:
            for k, t in tensors.items():
                out[k].copy_(t.detach())
        return out

    def copy_streamed(self, states: Any, names: tuple[str, ...], prefix: str) -> dict[str, torch.Tensor]:
        """Host copies of NVMe-backed states, read chunk by chunk."""
        out = {n: self._buffer(f"{prefix}/{n}", torch.Size([states.numel]), torch.float32) for n in names}
        for lo, hi, views in states.stream(names, write_back=False):
            for n in names:
                out[n][lo:hi].copy_(views[n])
        return out


_SAVES_OWN = re.compile(r"manifest\.json|manifest\.sha256|frozen\.safetensors|rank_\d{5,}\.safetensors")


def foreign_entries(folder: Path) -> list[str]:
    """Names in a checkpoint folder that no save wrote (someone's notes, an eval folder): a re-save of its tag or
    keep_last would delete them with the folder. A save's own: the files its manifest lists and the names a save gives
    its files (all a save leaves, should the manifest not read)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    try:
        files = json.loads((folder / mf.MANIFEST).read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        files = {}
    listed = set(files) if isinstance(files, dict) else set()
    return sorted(n for n in names if n not in listed and not _SAVES_OWN.fullmatch(n))


def keeps_others_files(root: Path, tag: str) -> None:
    """TagNotReplaceable if ROOT/<tag> holds files no save wrote: a re-save replaces the folder, deleting them."""
    extra = foreign_entries(root / tag) if (root / tag).is_dir() and not (root / tag).is_symlink() else []
    if extra:
        raise TagNotReplaceable(f"{one_line(str(root / tag))} holds {_names(extra)}, which no save wrote",
                                "a re-save replaces the whole folder: move them out of it or pass another tag")


def unprunable(root: Path, keep_last: int, saved: list[tuple[str, tuple[int, int] | None]]) -> list[str]:
    """Take out of `saved` (all keep_last may delete) those it would delete that hold files no save wrote."""
    notes = []
    for entry in saved[: max(0, len(saved) - keep_last)]:
        if extra := foreign_entries(root / entry[0]):
            saved.remove(entry)
            notes.append(f"the older checkpoint {entry[0]} was not pruned (keep_last): it holds {_names(extra)}, which "
                         "no save wrote; delete it once they are moved out")
    return notes


def _names(names: list[str]) -> str:
    return ", ".join(one_line(n) for n in names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def frozen_tensors(engine: "Engine", entries: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Frozen parameters and buffers of `entries`, each stored once (tied names point at their owner)."""
    state = engine.module.state_dict(keep_vars=True)
    return {e["name"]: state[e["name"]].detach() for e in entries if not e["trainable"] and not e["tied_to"]}


def without_frozen_parameters(engine: "Engine",
                              entries: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """(`entries` less the frozen parameters and the names tied to them, those parameters' names), for a save with
    DeepSpeed's exclude_frozen_parameters=True: buffers stay, as DeepSpeed's module entry keeps them."""
    state = engine.module.state_dict(keep_vars=True)
    left = [e["name"] for e in entries if not e["trainable"] and not e["tied_to"]
            and isinstance(state[e["name"]], torch.nn.Parameter)]
    gone = set(left)
    return [e for e in entries if e["name"] not in gone and e["tied_to"] not in gone], left


def buffer_names(engine: "Engine", entries: list[dict[str, Any]]) -> list[str]:
    """The names of `entries` that are buffers (tied names of one too), for the manifest's `buffers`: a
    consolidation that leaves out frozen parameters keeps these, as DeepSpeed's keeps its `buffer_names`."""
    state = engine.module.state_dict(keep_vars=True)
    return [e["name"] for e in entries if not isinstance(state[e["name"]], torch.nn.Parameter)]


def contents(engine: "Engine", entries: list[dict[str, Any]], buffers: HostBuffers | None) -> dict[str, Any]:
    """file name -> what goes in it: {tensor name: CPU tensor}, or NvmeStates for a synchronous save."""
    out: dict[str, Any] = {}
    opt = engine.optimizer
    if engine.layout.world_size > 1 or engine.rank == 0:  # stage 0: one copy is enough
        name = mf.rank_file(engine.rank)
        if isinstance(opt, ClientOptimizer):
            tensors = {"master": opt.states.master, **opt.state_arrays()[0]}
        elif isinstance(opt.states, TensorStates):
            tensors = {n: getattr(opt.states, n) for n in NAMES}
        elif buffers is None:
            tensors = None
            out[name] = NvmeStates(opt.states)
        else:
            tensors = None
            out[name] = buffers.copy_streamed(opt.states, NAMES, name)
        if tensors is not None:
            out[name] = buffers.copy(tensors, name) if buffers is not None else tensors
    if engine.rank == 0:
        frozen = frozen_tensors(engine, entries)
        out[mf.FROZEN_FILE] = buffers.copy(frozen, mf.FROZEN_FILE) if buffers is not None else frozen
    return out


class _Planned:
    """Stands in for HostBuffers in `contents`: records the buffers a save would make, copies nothing."""

    def __init__(self) -> None:
        self.specs: list[tuple[str, torch.Size, torch.dtype]] = []

    def copy(self, tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
        self.specs += [(f"{prefix}/{k}", t.shape, t.dtype) for k, t in tensors.items()]
        return tensors

    def copy_streamed(self, states: Any, names: tuple[str, ...], prefix: str) -> dict[str, torch.Tensor]:
        self.specs += [(f"{prefix}/{n}", torch.Size([states.numel]), torch.float32) for n in names]
        return {}


def reserve_for(engine: "Engine", buffers: HostBuffers) -> None:
    """Start making the host buffers an async save of `engine` copies into (see the module's docstring)."""
    from .checkpoint_load import param_entries

    planned = _Planned()
    contents(engine, param_entries(engine), planned)  # type: ignore[arg-type]
    buffers.reserve(planned.specs)
