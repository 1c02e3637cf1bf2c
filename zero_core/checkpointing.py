"""Engine save in zbench's checkpoint format (checkpoints/manifest.py); load is in checkpoint_load.py.

Save: every rank writes only its own partition (no gather); rank 0 adds frozen tensors and the manifest and
commits atomically (checkpoints/zbench_format.py). Files are hashed as they are written (no second read) and
a rank's files are written in parallel, each through a small ring of aligned (pinned on CUDA) buffers with
O_DIRECT where the filesystem allows it (checkpoints/staged_write.py): a synchronous save streams the live
tensors from the GPU to the disk without a whole host copy. A rank that cannot write (disk full, quota,
permissions) does not leave the others waiting: the ranks agree on the outcome, rank 0 removes the staging
folder it made, and every rank raises the same one-line CheckpointError; `latest` and the previous
checkpoint stay as they were.
`async_save=True` copies the state into reusable host buffers and writes, hashes, fsyncs and commits in
a background thread (checkpoint_async.py).
"""

from __future__ import annotations

import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from checkpoints import manifest as mf
from checkpoints import zbench_format as fmt
from checkpoints.io_errors import ACCESS, PATH, SPACE, write_cause
from checkpoints.manifest_checks import POINTERS
from checkpoints.paths import one_line, plain_name
from checkpoints.safetensors_stream import StreamingWriter, write_tensors
from checkpoints.source import CheckpointError
from checkpoints.tag_folder import TagNotReplaceable, check_replaceable

from . import checkpoint_markers as markers
from . import comm, recovery_script
from .checkpoint_async import Staging, leaves_no_staging, saver_of
from .client_state_codec import ENCODING, ENCODING_KEY
from .client_state_codec import encode as encode_client_state
from .checkpoint_load import load, param_entries  # noqa: F401  (load is re-exported for the engine)
from .checkpoint_snapshot import NvmeStates, buffer_names, contents, keeps_others_files, unprunable
from .checkpoint_snapshot import without_frozen_parameters
from .group_values_record import group_values_record
from .optim.client_optimizer import ClientOptimizer
from .optim.facade import EngineScheduler
from .optim.states import NAMES
from .rng_state import capture_rng

if TYPE_CHECKING:
    from .engine import Engine

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
_FIXES = {
    SPACE: "free space on that disk or pass another save_dir, then save again",
    ACCESS: "make the folder writable or pass another save_dir, then save again",
    PATH: "move that file away or pass another save_dir, then save again",
    None: "fix that and save again",
}


def _cause(e: BaseException) -> tuple[str, str]:
    """(what went wrong, how to fix it) for a failed write."""
    what, kind = write_cause(e)
    return what, _FIXES[kind]


def save_failed(root: Path, tag: str, problem: tuple[str, str]) -> CheckpointError:
    try:
        latest = fmt.read_latest(root) if root.is_dir() else None
    except CheckpointError:
        latest = None
    before = (
        f"the previous checkpoint ({latest}) and 'latest' are unchanged"
        if latest
        else "no earlier checkpoint exists there"
    )
    return CheckpointError(f"checkpoint {tag} was not saved in {root}: {problem[0]}; {problem[1]}; {before}")


def _write_synced(tensors: dict[str, torch.Tensor], path: Path) -> dict[str, Any]:
    """One file of whole tensors, hashed while written, fsynced (from a GPU a buffer at a time); its record."""
    return write_tensors(path, {k: v.detach() for k, v in tensors.items()})


def _write_nvme(states: Any, path: Path) -> dict[str, Any]:
    """States on NVMe, streamed chunk by chunk, never whole in memory."""
    writer = StreamingWriter(path, [(n, torch.float32, [states.numel]) for n in NAMES], align=4096)
    for n in NAMES:
        for _, _, views in states.stream((n,), write_back=False):
            writer.write(views[n])
    return writer.close()


def _write_file(content: Any, path: Path) -> dict[str, Any]:
    return _write_nvme(content.states, path) if isinstance(content, NvmeStates) else _write_synced(content, path)


def write_files(rank: int, files: dict[str, Any], staged: Path) -> tuple[dict[str, Any], tuple[str, str] | None]:
    """Write this rank's files side by side; (their records, the first problem or None)."""
    records: dict[str, Any] = {}
    with ThreadPoolExecutor(max(1, len(files)), thread_name_prefix="zbench-save") as pool:
        futures = {name: pool.submit(_write_file, content, staged / name) for name, content in files.items()}
        for name, future in futures.items():
            try:
                records[name] = future.result()
            except Exception as e:  # OSError, or a writer's own error type carrying the OS error's text
                what, fix = _cause(e)
                return records, (f"rank {rank} could not write {staged / name} ({what})", fix)
    return records, None


def _prepare(root: Path, tag: str) -> tuple[Path, list[Path]]:
    """Rank 0: the root folder, a tag replaced by a save that died put back, and a fresh staging folder;
    also the staging folders that dead saves left (reported, never removed: they are not ours)."""
    root.mkdir(parents=True, exist_ok=True)
    check_replaceable(root, tag)  # before anything moves: a link or file named like the tag is left alone
    keeps_others_files(root, tag)
    fmt.recover(root)
    markers.sweep(root)  # this process's abandoned async saves, once no rank writes there any more
    staged = fmt.staging_dir(root, tag, fmt.new_token())
    staged.mkdir()
    return staged, fmt.leftovers(root)


def _stage(engine: "Engine", root: Path, tag: str, staging: Staging) -> Path:
    """Collective: rank 0 makes the staging folder; every rank gets its path (or the same error)."""
    staged, problem = root, None
    if engine.rank == 0:
        try:
            staged, stale = _prepare(root, tag)
            staging.made(staged)  # from here an exception removes it (leaves_no_staging)
            if stale:
                print(
                    f"zero_core: {len(stale)} folder(s) left in {root} by saves that died "
                    f"({', '.join(one_line(d.name) for d in stale[:3])}); "
                    "they hold disk space: delete them once no save is running",
                    flush=True,
                )
        except TagNotReplaceable as e:
            problem = (e.strerror, e.fix)
        except OSError as e:
            what, fix = _cause(e)
            problem = (f"cannot create {e.filename or root} ({what})", fix)
    staged, problem = comm.broadcast_object((str(staged), problem), what="broadcast of the checkpoint folder's status")
    if problem:
        raise save_failed(root, tag, problem)
    return staging.made(Path(staged))


def publish(
    root: Path, tag: str, staged: Path, manifest: dict[str, Any], move_latest: bool, keep_last: int | None,
    saved: list[tuple[str, tuple[int, int] | None]], script: bool = False,
) -> tuple[str, str] | None:
    """Rank 0: write the manifest, commit, prune; the problem (staging folder removed) or None. `saved` is this
    engine's committed checkpoints, oldest first: the only ones keep_last may delete. Once committed, the save
    stands: what its clean-up could not delete is printed, not raised, and every rank hears of success."""
    try:
        keeps_others_files(root, tag)  # again: a user may have put files there while this save wrote
        mf.write(staged, manifest)
        note = fmt.commit(root, tag, staged, move_latest)
    except OSError as e:
        shutil.rmtree(staged, ignore_errors=True)  # made by this rank's _prepare
        if isinstance(e, TagNotReplaceable):
            return (e.strerror, e.fix)
        what, fix = _cause(e)
        return (f"rank 0 could not write the manifest or commit {tag} ({what})", fix)
    saved[:] = [s for s in saved if s[0] != tag] + [(tag, fmt.folder_identity(root / tag))]
    notes = ([note] if note else []) + (unprunable(root, keep_last, saved) + fmt.prune(root, keep_last, saved)
                                        if keep_last else [])
    script_note = recovery_script.place(root) if script else None  # zero_to_fp32.py, as DeepSpeed's save leaves
    notes += [script_note] if script_note else []
    for note in notes:
        print(f"zero_core: checkpoint {tag} saved in {root}; {note}", flush=True)
    return None


@leaves_no_staging
def save(
    engine: "Engine",
    save_dir: str | os.PathLike,
    tag: str | None = None,
    client_state: dict[str, Any] | None = None,
    keep_last: int | None = None,
    move_latest: bool = True,
    async_save: bool = False,
    exclude_frozen: bool = False,
) -> Path:
    """Collective. Returns the checkpoint folder (committed, or being committed in the background).
    `exclude_frozen`: the frozen parameters are left out, listed by name in the manifest's `excluded`."""
    saver = saver_of(engine)
    saver.wait()  # the previous save first: its buffers are reused, its failure is reported here
    staging = saver.staging = Staging(engine.rank, engine.world_size)  # what an exception leaves to remove
    root = Path(save_dir)
    tag = plain_name(tag or f"global_step{engine.global_step}", "checkpoint tag", "pass a plain folder name as tag")
    if tag in POINTERS or tag in recovery_script.SCRIPTS:
        raise CheckpointError(f"checkpoint tag {tag!r} is the name of a file written beside the checkpoints (the "
                              "pointer file, zero_to_fp32.py, zero_to_torch.py); pass another tag")
    if keep_last is not None and (isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1):
        raise CheckpointError(f"keep_last must be a whole number >= 1 or None, got {keep_last!r}")
    client_state = encode_client_state(client_state)  # a typed copy, or refused before anything is written
    entries = param_entries(engine)  # first: a tensor no file can hold is refused before anything is written
    entries, excluded = without_frozen_parameters(engine, entries) if exclude_frozen else (entries, None)
    staged = _stage(engine, root, tag, staging)
    files = contents(engine, entries, saver.buffers if async_save else None)  # sync: the live tensors, streamed
    staging.files = list(files)
    rng = comm.all_gather_object(capture_rng(engine.device), what="all-gather of the RNG states")
    manifest = (
        _manifest(engine, tag, entries, {}, {str(r): s for r, s in enumerate(rng)}, client_state)
        if engine.rank == 0
        else None
    )
    if manifest is not None:
        manifest["buffers"] = buffer_names(engine, entries)  # a consolidation without frozen parameters keeps these
        if excluded is not None:
            manifest["excluded"] = excluded
    saver.recovery_script = engine.deepspeed_checkpoints
    if async_save:
        staging.phase = "background"  # its thread cleans up after itself from here
        saver.start(root, tag, staged, files, manifest, move_latest, keep_last)
        return root / tag
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)  # the writer threads copy from the live states on streams of their own
    records, problem = write_files(engine.rank, files, staged)
    staging.phase = "exchanging"  # rank 0 may commit this rank's files from here
    gathered = comm.all_gather_object(
        {"files": records, "problem": problem}, what="all-gather of the checkpoint's file list"
    )
    staging.phase = "exchanged"  # no rank writes into the folder any more
    problem = next((g["problem"] for g in gathered if g["problem"]), None)
    if engine.rank == 0:
        if problem is None:
            assert manifest is not None
            manifest["files"] = {k: v for g in gathered for k, v in g["files"].items()}
            problem = publish(root, tag, staged, manifest, move_latest, keep_last, saver.saved, saver.recovery_script)
        else:
            shutil.rmtree(staged, ignore_errors=True)  # made by this rank's _prepare above
    problem = comm.broadcast_object(problem, what="broadcast of the checkpoint's commit status")
    if problem:
        raise save_failed(root, tag, problem)
    return root / tag


def _manifest(engine: "Engine", tag: str, entries: list[dict[str, Any]], files: dict[str, Any], rng: dict[str, Any],
              client_state: dict[str, Any]) -> dict[str, Any]:
    c, opt = engine.config, engine.optimizer
    return {
        "format": mf.FORMAT,
        "version": mf.VERSION,
        "tag": tag,
        "step": engine.global_step,
        "micro_steps": engine.micro_steps,
        "world_size": engine.world_size,
        "stage": engine.stage,
        "dtype": _DTYPE_NAMES[engine.dtype],
        "layout": mf.layout_record(engine.layout),
        "params": entries,
        "fragments": mf.fragment_records(engine.layout),
        "files": files,
        "optimizer": {
            "type": c.optimizer.type,
            "lr": c.optimizer.params.lr,
            "betas": list(c.optimizer.params.betas),
            "eps": c.optimizer.params.eps,
            "weight_decay": c.optimizer.params.weight_decay,
            "decoupled": c.optimizer.decoupled,
            "gradient_clipping": c.gradient_clipping,
            "applied": float(opt.applied),
            "skipped": float(opt.skipped),
            "group_lrs": engine.get_lr(),  # what DeepSpeed's saved groups hold: the next update's lr of each group
            "group_values": group_values_record(engine.client_optimizer.param_groups),  # what the loop may have set
            **_optimizer_states(opt),
        },
        "loss_scaler": {
            k: (v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in engine.scaler.state_dict().items()
        },
        "rng": rng,
        "client_state": client_state,
        ENCODING_KEY: ENCODING,  # client_state as client_state_codec.py writes it
        "scheduler": _scheduler_state(engine),
    }


def _scheduler_state(engine: Any) -> dict[str, Any]:
    """The config's schedule at its position (DeepSpeed's own state, the script's extra steps included), else
    the host schedule's state."""
    if isinstance(engine.lr_scheduler, EngineScheduler):
        return engine.lr_scheduler.state_dict()
    return engine.host_schedule.state_dict() if engine.host_schedule is not None else {}


def _optimizer_states(opt: Any) -> dict[str, Any]:
    """What the rank files hold besides the master, and a client optimizer's shared scalars."""
    if not isinstance(opt, ClientOptimizer):
        return {"state_keys": list(NAMES[1:])}
    arrays, scalars = opt.state_arrays()
    return {"state_keys": sorted(arrays), "client": type(opt.client).__name__, "client_scalars": scalars}
