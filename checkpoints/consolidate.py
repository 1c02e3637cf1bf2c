"""Write any checkpoint source as consolidated safetensors, one parameter in memory at a time.

Output: `out_dir/model.safetensors`, or when the total exceeds `max_shard_size`, Hugging Face-style
shards `model-00001-of-0000N.safetensors` plus `model.safetensors.index.json`
(`{"metadata": {"total_size": bytes}, "weight_map": {name: shard}}`). A tied parameter is stored
once, under its owner's name; the index maps both names to that shard, and the single-file case
records `alias.<name>: <owner>` in the safetensors metadata. Floating tensors are cast to `dtype`
(from the fp32 the source gives); integer and bool buffers keep their dtype.

Everything is written into a staging folder beside `out_dir`, claimed for this process alone, and
renamed into place at the end (output_claim.py), so a failure leaves nothing behind and two converts
into one folder cannot spoil each other's output.

Verification, when asked for, reads nothing twice. A source that checks what it reads as it reads it
(`read_problems`: DeepSpeed's zip records carry CRC-32s) is asked at the end what failed; any other source's
`verify` runs in a thread beside the conversion, reading each file front to back, the read-ahead that brings
the files in from disk once. Either way the output is renamed into place only if it passes.
Speed: the next tensor is loaded while the current one is cast and written, when both fit in the memory
bound (1.5x the largest tensor + 256 MB: tensors above half the largest load alone).
"""

from __future__ import annotations

import json
import re
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch

from .output_claim import claimed_output
from .read_guard import MIXED, FolderWatch
from .safetensors_stream import StreamingWriter
from .source import CheckpointError, CheckpointSource, ParamInfo

_CHUNK = 1 << 22  # elements cast and written at a time: bounds the extra memory beyond one tensor
_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}


def parse_size(text: str | int) -> int:
    """Bytes in a size such as "5GB" (10**9, as Hugging Face counts), "500MiB" or "1000"."""
    if isinstance(text, int) and not isinstance(text, bool):  # a bool is no size: refused below, as text
        if text < 1:
            raise ValueError(f"size {text!r} must be at least 1 byte")
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError(f"size {text!r} is not understood; write e.g. 5GB, 500MB, 2GiB or a number of bytes")
    value = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if value < 1:
        raise ValueError(f"size {text!r} must be at least 1 byte")
    return value


def _out_dtype(info: ParamInfo, dtype: torch.dtype) -> torch.dtype:
    stored = getattr(torch, info.dtype, None)
    return dtype if not isinstance(stored, torch.dtype) or stored.is_floating_point else stored


def _nbytes(info: ParamInfo, dtype: torch.dtype) -> int:
    n = 1
    for d in info.shape:
        n *= d
    return n * torch.empty((), dtype=dtype).element_size()


def plan_shards(sizes: list[tuple[str, int]], max_shard_size: int) -> list[list[str]]:
    """Greedy split in order: a new shard starts when the next tensor would pass the limit."""
    shards: list[list[str]] = [[]]
    used = 0
    for name, size in sizes:
        if shards[-1] and used + size > max_shard_size:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += size
    return shards


def _loaded(source: CheckpointSource, infos: list[ParamInfo], pool: ThreadPoolExecutor) -> Iterator[torch.Tensor]:
    """source.load of each tensor in order, the next one loading while the caller writes this one (when
    both are at most half the largest: the pair then fits in 1.5x the largest)."""
    sizes = [_nbytes(i, torch.float32) for i in infos]
    small = max(sizes, default=0) // 2
    ahead: Future | None = None
    for k, info in enumerate(infos):
        t = ahead.result() if ahead is not None else source.load(info.name)
        ahead = None
        if k + 1 < len(infos) and sizes[k] <= small and sizes[k + 1] <= small:
            ahead = pool.submit(source.load, infos[k + 1].name)
        yield t


def first_problem(problems: list[str]) -> str:
    more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
    return f"{problems[0]}{more}; restore the file(s) from where the checkpoint was saved"


def write_consolidated(
    source: CheckpointSource,
    out_dir: str | Path,
    dtype: torch.dtype,
    max_shard_size: int,
    progress: bool = True,
    protect: Iterable[str | Path] = (),
    verify: bool = False,
    out_name: str = "--out",
    add_files: Callable[[Path], None] | None = None,
) -> list[Path]:
    """Stream every parameter of `source` into safetensors under `out_dir`; returns the files written.
    With `verify`, the source's integrity check runs in the same pass; its first problem fails it, nothing written.
    `add_files(folder)` writes more files (an HF folder's config, tokenizer) beside the shards, before the output is
    published: a convert killed while they are written leaves no `out_dir` that looks complete.

    `out_dir` must be new or empty and outside the source's folder and the `protect` folders; refusals name it as
    `out_name` (the CLI's flag by default, a parameter's name for the Python API)."""
    watch = FolderWatch(source)
    with ThreadPoolExecutor(2, thread_name_prefix="zbench-convert") as pool:
        check: Callable[[], list[str]] | None = None
        if verify:  # checked as read where the source can, else by a thread reading every file beside the conversion
            check = getattr(source, "read_problems", None) or pool.submit(source.verify).result
        if watch.identity is not None:  # a save of the same tag renames a new folder in: reads after it would mix
            check = _unless_replaced(watch, check)
        try:
            files = _write(source, out_dir, dtype, max_shard_size, progress, protect, pool, check, out_name, add_files)
        except (CheckpointError, OSError) as e:  # a file of the replaced folder may be gone: not a write problem
            if watch.replaced():
                raise CheckpointError(watch.message(MIXED)) from None
            if not isinstance(e, CheckpointError):
                raise
            problems = check() if check is not None else []
            if problems:  # a damaged file explains a failure better than its symptom
                raise CheckpointError(first_problem(problems)) from None
            raise
    return files



def _unless_replaced(watch: FolderWatch, check: Callable[[], list[str]] | None) -> Callable[[], list[str]]:
    """`check`, run before the output is published, preceded by a look at whether the folder is still the one read."""

    def checked() -> list[str]:
        watch.check(MIXED)
        return check() if check is not None else []

    return checked


def _write(
    source: CheckpointSource,
    out_dir: str | Path,
    dtype: torch.dtype,
    max_shard_size: int,
    progress: bool,
    protect: Iterable[str | Path],
    pool: ThreadPoolExecutor,
    check: Callable[[], list[str]] | None,
    out_name: str,
    add_files: Callable[[Path], None] | None = None,
) -> list[Path]:
    out_dir = Path(out_dir)
    protect = [*protect, *([source.folder] if hasattr(source, "folder") else [])]
    infos = source.params()
    stored = [i for i in infos if not i.tied_to]
    out_dtypes = {i.name: _out_dtype(i, dtype) for i in stored}
    shards = plan_shards([(i.name, _nbytes(i, out_dtypes[i.name])) for i in stored], max_shard_size)
    names = (
        ["model.safetensors"]
        if len(shards) == 1
        else [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))]
    )
    shard_of = {n: names[k] for k, shard in enumerate(shards) for n in shard}
    by_name = {i.name: i for i in stored}
    aliases = {i.name: i.tied_to for i in infos if i.tied_to}

    total = sum(_nbytes(i, out_dtypes[i.name]) for i in stored)
    with claimed_output(out_dir, protect, out_name) as tmp, _progress(progress, total) as bar:
        for fname, shard in zip(names, shards):
            meta = {"format": "pt"}
            if len(shards) == 1:
                meta.update({f"alias.{a}": o for a, o in aliases.items()})
            w = StreamingWriter(tmp / fname, [(n, out_dtypes[n], by_name[n].shape) for n in shard], metadata=meta)
            for n, t in zip(shard, _loaded(source, [by_name[n] for n in shard], pool)):
                _write_one(w, t, by_name[n], out_dtypes[n])
                bar(n, _nbytes(by_name[n], out_dtypes[n]))
            w.close()
        if len(shards) > 1:
            weight_map = {i.name: shard_of[i.tied_to or i.name] for i in infos}
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
            names.append("model.safetensors.index.json")
        if add_files is not None:
            add_files(tmp)
        problems = check() if check is not None else []
        if problems:  # before the output is renamed into place: the claim removes it
            raise CheckpointError(first_problem(problems))
    return [out_dir / n for n in names]


def _write_one(w: StreamingWriter, t: torch.Tensor, info: ParamInfo, dtype: torch.dtype) -> None:
    if tuple(t.shape) != tuple(info.shape):
        raise CheckpointError(
            f"{info.name}: the checkpoint gives shape {tuple(t.shape)} but lists {info.shape}; it is inconsistent"
        )
    flat = t.reshape(-1)
    for lo in range(0, flat.numel(), _CHUNK):  # an empty tensor writes nothing: the writer skips it
        w.write(flat[lo : lo + _CHUNK].to(dtype))


class _progress:
    """A rich progress bar over bytes on stderr (or nothing); call it with (name, bytes) per tensor."""

    def __init__(self, enabled: bool, total: int) -> None:
        self.enabled, self.total = enabled, total

    def __enter__(self):
        try:  # rich comes with zbench; a bare torch + safetensors install converts without a bar
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn
        except ImportError:
            self.enabled = False
        if not self.enabled:
            return lambda name, n: None

        self._p = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self._p.__enter__()
        task = self._p.add_task("writing", total=self.total)
        return lambda name, n: self._p.update(task, advance=n, description=name[-40:])

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self._p.__exit__(*exc)
