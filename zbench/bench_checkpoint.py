"""`zbench bench checkpoint`: one rank's checkpoint I/O, zero_core beside DCP and DeepSpeed, and the disk's floor.

One process, one device (the GPU when there is one). The training state of a model of about `params`
parameters (a stack of square Linear layers: I/O depends on bytes, not on the architecture) after one step
is saved and loaded by each system in turn, each load from a cold page cache (the checkpoint's pages dropped
first); zero_core's checkpoint is converted to fp32 safetensors, and so is DeepSpeed's, by zbench and by
DeepSpeed's own `zero_to_fp32`. Time is wall clock around each call; an
async save has two rows: how long training was blocked, and when the checkpoint was durable. zero_core runs
with `zero_core.async_checkpoint`, so initialize makes the async save's host buffers (pinned on a GPU) on a
background thread (its own row: seconds from initialize until they exist); the first async save and a second
one are timed apart.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.metadata
import os
import shutil
import tempfile
import time
from pathlib import Path
from collections.abc import Iterator
from typing import Any, Callable

from .bench_disk import disk_floor, drop_cached


def _model(params: int, cuda: bool) -> Any:
    import torch

    d = 2048 if params >= 1 << 28 else 512
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(d, d, bias=False) for _ in range(max(1, params // (d * d)))])


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _engine_config(cuda: bool) -> dict[str, Any]:
    """The one config both engines save under: ZeRO-2, bf16 on a GPU, torch's AdamW (DeepSpeed's FusedAdam would
    need a JIT build; zero_core reads the key and runs its own fused update)."""
    return {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2}, "bf16": {"enabled": cuda},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}}}


def _step(forward: Any, backward: Callable[[Any], None], step: Callable[[], None], d: int, dev: Any) -> None:
    """One training step of `forward` (a module or engine), its inputs in its weights' dtype (nothing autocasts)."""
    import torch

    x = torch.randn(4, d, device=dev, dtype=next(iter(forward.parameters())).dtype)
    backward(forward(x).float().pow(2).mean())
    step()
    _sync()


def _zero_core(model: Any, root: Path, cuda: bool, rows: list) -> Path:
    import torch

    import zero_core

    # async_checkpoint: initialize makes the async save's pinned host buffers on a thread of its own
    t0 = time.perf_counter()
    config = {**_engine_config(cuda), "zero_core": {"async_checkpoint": True}}
    engine = zero_core.initialize(copy.deepcopy(model), config)
    gib = engine._async_saver.buffers.nbytes / 2**30  # waits for them: the sync save below is timed alone
    rows.append(("zero_core", f"async buffers: initialize to {gib:.2f} GiB made (background thread)",
                 time.perf_counter() - t0, 0))
    _step(engine, engine.backward, engine.step, model[0].in_features, engine.device)
    secs, folder = _timed(lambda: engine.save_checkpoint(root / "zero_core", tag="sync", async_save=False))
    size = _size(folder)
    rows.append(("zero_core", "save (sync, durable)", secs, size))

    def async_save(tag: str) -> tuple[float, float]:
        """(seconds training was blocked, GiB of host buffers)."""
        blocked, _ = _timed(lambda: engine.save_checkpoint(root / "zero_core", tag=tag, async_save=True))
        return blocked, engine._async_saver.buffers.nbytes / 2**30

    blocked, gib = async_save("async_first")
    rows.append(("zero_core", f"save (async, first): training blocked ({gib:.2f} GiB buffers)", blocked, size))
    engine.wait_for_checkpoint()
    shutil.rmtree(root / "zero_core" / "async_first")  # disk space: the GPU machine's disk holds few 0.77 B states
    blocked, gib = async_save("async")
    rows.append(("zero_core", f"save (async): training blocked ({gib:.2f} GiB buffers reused)", blocked, size))
    rest, _ = _timed(engine.wait_for_checkpoint)
    rows.append(("zero_core", "save (async): durable after", blocked + rest, size))
    drop_cached([folder])
    secs, _ = _timed(lambda: (engine.load_checkpoint(root / "zero_core", tag="sync"), _sync()))
    rows.append(("zero_core", "load (cold cache)", secs, size))
    engine = None  # frees it (the timed lambdas above are done with it)
    torch.cuda.empty_cache() if cuda else None
    return folder


def _convert(folder: Path, out: Path, rows: list, system: str = "zbench convert") -> None:
    import torch

    from checkpoints.consolidate import write_consolidated
    from checkpoints.detect import open_source

    drop_cached([folder])
    secs, _ = _timed(
        lambda: write_consolidated(open_source(folder), out, torch.float32, 5 * 10**9, progress=False, verify=True)
    )
    rows.append((system, "to fp32 safetensors, verified (cold cache)", secs, _size(folder)))


def _dcp(model: Any, root: Path, cuda: bool, rows: list) -> None:
    import torch
    import torch.distributed.checkpoint as dcp

    dev = torch.device("cuda" if cuda else "cpu")
    m = copy.deepcopy(model).to(dev, torch.bfloat16 if cuda else torch.float32)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    _step(m, lambda loss: loss.backward(), opt.step, model[0].in_features, dev)
    state = {"model": m.state_dict(), "optim": opt.state_dict()}
    secs, _ = _timed(lambda: dcp.save(state, checkpoint_id=str(root / "dcp_sync")))
    size = _size(root / "dcp_sync")
    rows.append(("DCP", "save (sync; no fsync)", secs, size))
    blocked, future = _timed(lambda: dcp.async_save(state, checkpoint_id=str(root / "dcp_async")))
    rows.append(("DCP", "save (async): training blocked", blocked, size))
    rest, _ = _timed(future.result)
    rows.append(("DCP", "save (async): written after (no fsync)", blocked + rest, size))
    drop_cached([root / "dcp_sync"])
    secs, _ = _timed(lambda: (dcp.load(state, checkpoint_id=str(root / "dcp_sync")), _sync()))
    rows.append(("DCP", "load (cold cache)", secs, size))


def _deepspeed(model: Any, root: Path, cuda: bool, rows: list) -> None:
    try:  # the installed distribution, not any folder named deepspeed on the path
        importlib.metadata.version("deepspeed")
        import deepspeed
    except (ImportError, importlib.metadata.PackageNotFoundError):
        return
    m = copy.deepcopy(model)
    engine, *_ = deepspeed.initialize(model=m, model_parameters=m.parameters(), config=_engine_config(cuda))
    _step(engine, engine.backward, engine.step, model[0].in_features, engine.device)
    secs, _ = _timed(lambda: (engine.save_checkpoint(str(root / "deepspeed"), tag="sync"), _sync()))
    size = _size(root / "deepspeed")
    rows.append(("DeepSpeed", "save (sync; no fsync)", secs, size))
    drop_cached([root / "deepspeed"])
    secs, _ = _timed(lambda: (engine.load_checkpoint(str(root / "deepspeed"), tag="sync"), _sync()))
    rows.append(("DeepSpeed", "load (cold cache)", secs, size))
    engine = None
    # the same DeepSpeed checkpoint to fp32 safetensors: zbench's converter (verified) and DeepSpeed's own
    _convert(root / "deepspeed" / "sync", root / "zbench_from_deepspeed", rows, "zbench convert of DeepSpeed's")
    from deepspeed.utils.zero_to_fp32 import convert_zero_checkpoint_to_fp32_state_dict as ds_convert

    drop_cached([root / "deepspeed"])
    out = root / "deepspeed_fp32"
    secs, _ = _timed(lambda: ds_convert(str(root / "deepspeed"), str(out), safe_serialization=True, tag="sync"))
    rows.append(("DeepSpeed", "zero_to_fp32 to safetensors (cold cache; no fsync, no check)", secs, size))


def _empty(root: Path) -> None:
    """Remove what the bench wrote under `root` (a folder it made itself)."""
    for p in root.iterdir():
        shutil.rmtree(p) if p.is_dir() else p.unlink()


@contextlib.contextmanager
def _process_group() -> Iterator[None]:
    """A one-rank process group for the engines, unless one exists; the one made here (and the launcher variables it
    set) is taken down again, so a caller in the same process (a test, a notebook) is left as it was."""
    import torch
    import torch.distributed as dist

    from zero_core.comm import free_port

    if dist.is_initialized():
        yield
        return
    port = free_port()
    names = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
    saved = {k: os.environ.get(k) for k in names}
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    dist.init_process_group("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")
    try:
        yield
    finally:
        dist.destroy_process_group()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run(params: int, folder: Path | None) -> tuple[list[tuple[str, str, float, int]], dict[str, Any]]:
    """Rows of (system, operation, seconds, bytes) and the disk floor, measured in `folder` (a temp dir by default)."""
    import torch

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(0)
    root = Path(tempfile.mkdtemp(prefix="zbench-ckpt-bench-", dir=folder))
    rows: list[tuple[str, str, float, int]] = []
    try:
        with _process_group():
            model = _model(params, cuda)
            zc = _zero_core(model, root, cuda, rows)
            floor = disk_floor(root, _size(zc))
            _convert(zc, root / "converted", rows)
            _empty(root)  # a GPU machine's disk holds few 0.77 B training states at once
            _dcp(model, root, cuda, rows)
            _empty(root)
            _deepspeed(model, root, cuda, rows)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    info = {
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "params": sum(p.numel() for p in model.parameters()),
        "torch": torch.__version__,
        "folder": str(root.parent),
        **floor,
    }
    return rows, info
