"""Async checkpoint saves: training waits only for the copy into host buffers; a thread does the rest.

The background thread of every rank writes its files (hashed while written, fsynced) into the staging
folder and leaves a marker `.rank_<r>.done` there with their records, or with the problem it met. Rank 0's
thread waits for every rank's marker, writes the manifest and commits as a synchronous save does; until
the rename, the previous checkpoint and `latest` are untouched, so a crash at any point leaves the previous
checkpoint loadable. No collective runs off the main thread: the ranks learn the outcome in
`wait_for_checkpoint()` (collective), which the next save, a load, and the engine's end of life call.
A save rank 0 gives up on (a rank's failure, its wait running out) is removed only once no rank still writes
there (checkpoint_markers.py). A save that raises on the main thread (Ctrl-C, an error before the commit or before
the thread starts) removes what this rank may of its staging folder on the way out (Staging).
"""

from __future__ import annotations

import concurrent.futures.thread  # noqa: F401  (its exit hook is registered first, so that it runs after ours)
import contextlib
import functools
import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from checkpoints.zbench_format import folder_identity

from . import checkpoint_markers as markers
from . import comm
from .checkpoint_snapshot import HostBuffers

if TYPE_CHECKING:
    from .engine import Engine

DEFAULT_WAIT_S = 1800.0  # how long rank 0 waits for the other ranks' files (the collective timeout, if set)
_in_flight: set["AsyncSaver"] = set()  # savers whose background save has not finished


def _finish_in_flight() -> None:
    """At exit, before Python's own exit hook for thread pools (registered earlier, so run later) refuses the pools
    the writers still need: let every save in flight finish, committed or cleaned up, as its non-daemon thread is
    meant to (without this a script that ends right after an async save loses that checkpoint)."""
    for saver in list(_in_flight):
        saver._finished.wait()


threading._register_atexit(_finish_in_flight)  # type: ignore[attr-defined]  # CPython's, as concurrent.futures uses


def _leave_marker(staged: Path, rank: int, report: dict[str, Any]) -> None:
    tmp = staged / f".rank_{rank:05d}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(report, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, markers.done(staged, rank))


def _report(staged: Path, rank: int, files: dict[str, Any], records: dict[str, Any],
            problem: tuple[str, str] | None) -> tuple[str, str] | None:
    """Leave this rank's marker; the problem to report. A full disk that refused a rank file may refuse the marker
    too, and rank 0 would then wait its whole timeout for it: this rank's own files go first, freeing the space.
    So do they when rank 0 gave up on the save meanwhile: of no use, and rank 0 deletes no file a rank may write."""
    report = {"files": records, "problem": problem}
    if markers.abandoned(staged):
        _drop(staged, rank, files)
    try:
        _leave_marker(staged, rank, report)
        return problem
    except OSError as e:
        first = e
    if problem is not None:  # the save failed anyway: what this rank wrote for it is of no use
        _drop(staged, rank, files)
        try:
            _leave_marker(staged, rank, report)
            return problem
        except OSError:
            pass
    from .checkpointing import _cause

    what, fix = _cause(first)
    return problem or (f"rank {rank} could not write into {staged} ({what})", fix)


def _drop(staged: Path, rank: int, files: dict[str, Any]) -> None:
    """Delete this rank's own files of the save (one that cannot be goes with the folder, once rank 0 removes it)."""
    for path in [*(staged / name for name in files), staged / f".rank_{rank:05d}.tmp"]:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)


def _collect(staged: Path, world: int, wait_s: float, records: dict[str, Any],
             problem: tuple[str, str] | None) -> tuple[dict[str, Any], tuple[str, str] | None]:
    """Rank 0 (its own `records` and `problem` given): every rank's file records, or the first problem (a rank's,
    or the wait running out). After a problem it still waits, until the same deadline, for the ranks writing on, so
    that their folder can go; the folder is marked abandoned at once, so that they delete their files when done."""
    deadline = time.monotonic() + wait_s
    files = dict(records)
    if problem is not None:
        markers.abandon(staged, world)
    for rank in range(1, world):
        path = markers.done(staged, rank)
        while not path.is_file():
            if time.monotonic() > deadline:
                return files, problem or (f"rank {rank} did not finish writing its files within {wait_s:.0f} s",
                                          "check that rank and the disk, then save again")
            time.sleep(0.02)
        report = json.loads(path.read_text(encoding="utf-8"))
        if report["problem"] and problem is None:
            problem = tuple(report["problem"])
            markers.abandon(staged, world)
        files.update(report["files"])
    return files, problem


class AsyncSaver:
    """One engine's saves: the background one in flight (at most one; its host buffers are reused by the next),
    and the checkpoints this engine committed (keep_last deletes only those)."""

    def __init__(self, rank: int, world: int, wait_s: float) -> None:
        self.rank, self.world, self.wait_s = rank, world, wait_s
        self.buffers = HostBuffers()
        self._thread: threading.Thread | None = None
        self._finished = threading.Event()  # set by the thread as its last act: its outcome is final
        self._outcome: tuple[str, str] | None = None
        self._pending: tuple[Path, str] | None = None
        self._all_done = False  # rank 0: every rank's marker is in, so no rank writes into the staging folder
        self.saved: list[tuple[str, tuple[int, int] | None]] = []  # rank 0: this engine's commits, for keep_last
        self.recovery_script = False  # rank 0 writes zero_to_fp32.py after each commit (checkpointing.save sets it)
        self.staging: Staging | None = None  # the save in progress on the main thread (checkpointing.save)

    def start(self, root: Path, tag: str, staged: Path, files: dict[str, Any], manifest: dict[str, Any] | None,
              move_latest: bool, keep_last: int | None) -> None:
        if self.rank == 0:
            print(f"zero_core: checkpoint {tag} copied into {self.buffers.nbytes / 2**20:.1f} MiB of host buffers; "
                  "writing it in the background", flush=True)
        self._pending, self._outcome = (root, tag), None
        self._finished.clear()
        _in_flight.add(self)
        self._thread = threading.Thread(target=self._run, name="zbench-async-save", daemon=False,
                                        args=(root, tag, staged, files, manifest, move_latest, keep_last))
        self._thread.start()

    def _run(self, root: Path, tag: str, staged: Path, files: dict[str, Any], manifest: dict[str, Any] | None,
             move_latest: bool, keep_last: int | None) -> None:
        self._all_done = False
        try:
            self._outcome = self._save(root, tag, staged, files, manifest, move_latest, keep_last)
        except Exception as e:  # whatever it is, wait() must report it, not a success
            self._outcome = (f"rank {self.rank}'s background save failed ({type(e).__name__}: {str(e)[:200]})",
                             "fix that and save again")
            if self.rank == 0 and self._all_done:
                shutil.rmtree(staged, ignore_errors=True)  # made by this rank; every rank is done with it
            elif self.rank == 0:
                markers.give_up(staged, self.world, list(files))
            elif not markers.done(staged, self.rank).exists():  # rank 0 hears of it now, not at its timeout
                _report(staged, self.rank, files, {}, self._outcome)
        finally:
            _in_flight.discard(self)
            self._finished.set()

    def _save(self, root: Path, tag: str, staged: Path, files: dict[str, Any], manifest: dict[str, Any] | None,
              move_latest: bool, keep_last: int | None) -> tuple[str, str] | None:
        """This rank's part of the save; rank 0 also commits. The problem, or None."""
        from .checkpointing import publish, write_files

        records, problem = write_files(self.rank, files, staged)
        problem = _report(staged, self.rank, files, records, problem)
        if self.rank != 0:
            return problem
        gathered, problem = _collect(staged, self.world, self.wait_s, records, problem)
        if problem is not None:
            markers.give_up(staged, self.world, list(files))  # removed only once no rank still writes there
            return problem
        self._all_done = True
        for rank in range(self.world):
            markers.done(staged, rank).unlink(missing_ok=True)
        assert manifest is not None
        return publish(root, tag, staged, {**manifest, "files": gathered}, move_latest, keep_last, self.saved,
                       self.recovery_script)

    @property
    def busy(self) -> bool:
        return self._thread is not None and not self._finished.is_set()  # not is_alive(): see wait()

    def wait(self) -> Path | None:
        """Collective: finish the save in flight; CheckpointError if it failed on any rank."""
        from .checkpointing import save_failed

        if self._pending is None:
            return None
        assert self._thread is not None
        # not join(): on CPython 3.11 a join interrupted by Ctrl-C marks the thread stopped while it still runs (the
        # bpo-45274 handling in threading), so a later wait would return early and a later save reuse its buffers
        self._finished.wait()
        (root, tag), self._pending = self._pending, None
        outcome = comm.broadcast_object(self._outcome if self.rank == 0 else None,
                                        what="broadcast of the async checkpoint's outcome")
        if outcome is not None:
            raise save_failed(root, tag, tuple(outcome))
        return root / tag


class Staging:
    """The staging folder of the save this rank is in, and what this rank may remove of it if the save raises (Ctrl-C,
    any error before the commit): rank 0 made the folder, every rank writes its own files into it.

    Rank 0 removes the folder once no rank can be writing there: at one rank, or once every rank's file list is in.
    Before that, deleting it under a rank that still writes would leave that rank's files written into nothing (or a
    half-removed folder, if one was being created), so rank 0 deletes only its own files and marks the folder
    abandoned (checkpoint_markers.py): this process's next save removes it once every other rank has said it is
    done. Another rank deletes its own files and says so, except once it has begun to hand them to rank 0, which may
    be committing them: then only if rank 0 has marked the folder abandoned. Once an async save's background thread
    has the folder, the thread cleans up after itself."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world
        self.folder: Path | None = None
        self.identity: tuple[int, int] | None = None  # rank 0: the folder it made (a commit renames it away)
        self.files: list[str] = []  # this rank's files in it
        self.phase = "writing"  # then "exchanging" (file lists go to rank 0), "exchanged", or "background"

    def made(self, folder: Path) -> Path:
        """`folder` is this save's staging folder (rank 0: made this instant by this rank)."""
        self.folder = folder
        if self.rank == 0 and self.identity is None:
            self.identity = folder_identity(folder)
        return folder

    def leave(self, error: BaseException) -> None:
        """Remove what this rank may of the folder, after `error`; never raises: `error` is what to report."""
        folder = self.folder
        if folder is None or self.phase == "background":
            return
        with contextlib.suppress(OSError):
            if self.rank == 0:
                if folder_identity(folder) != self.identity:
                    return  # committed meanwhile: renamed away, no longer this save's staging folder
                if self.world == 1 or self.phase == "exchanged":
                    shutil.rmtree(folder, ignore_errors=True)
                else:
                    markers.give_up(folder, self.world, self.files)
            elif self.phase == "writing" or (self.phase == "exchanging" and markers.abandoned(folder)):
                _drop(folder, self.rank, dict.fromkeys(self.files))
                problem = (f"rank {self.rank}'s save stopped ({type(error).__name__})", "save again")
                _leave_marker(folder, self.rank, {"files": {}, "problem": problem})


def leaves_no_staging(save: Callable[..., Path]) -> Callable[..., Path]:
    """`save` (checkpointing.save), which on its way out of any exception first removes what this rank may of the
    save's staging folder (Staging.leave), then re-raises it."""

    @functools.wraps(save)
    def guarded(engine: "Engine", *args: Any, **kwargs: Any) -> Path:
        saver = saver_of(engine)
        try:
            return save(engine, *args, **kwargs)
        except BaseException as e:
            if saver.staging is not None:
                saver.staging.leave(e)
            raise
        finally:
            saver.staging = None

    return guarded


def saver_of(engine: "Engine") -> AsyncSaver:
    """The engine's saver, made on first use."""
    saver = getattr(engine, "_async_saver", None)
    if saver is None:
        wait_s = engine.config.zero_core.comm_timeout_s or DEFAULT_WAIT_S
        saver = engine._async_saver = AsyncSaver(engine.rank, engine.world_size, wait_s)
    return saver
