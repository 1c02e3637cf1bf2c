"""Launch a function on N local ranks through torch's elastic launcher (what torchrun runs).

One node: a c10d rendezvous on a free localhost port. Several nodes: torchrun's flags pass through
(`--nnodes`, `--node-rank`, `--rdzv-endpoint`, `--rdzv-backend`, `--rdzv-id`); every launch of a run
uses the endpoint's port plus the launch's index, so a launch never meets the previous launch's
rendezvous store while it is shutting down (open PORT .. PORT + launches - 1 between the nodes).

Each rank's stdout/stderr go to `<log_dir>/<run_id>_*/attempt_0/<local_rank>/`. A failed rank
becomes one `RankFailure` naming the rank, its exit code, the error and the last lines of its log;
an out-of-memory failure is an `OutOfMemory` (a row of the table, not the end of the run).

Start method: a spawned rank re-imports torch (several seconds each on a small machine), a forked one
starts at once. Forking is only safe from a process that has run no torch op (a forked child hangs
in the first multi-threaded op if its parent's OpenMP pool exists) and never with CUDA, so ranks are
forked only when the caller says its process is fresh (`fork_ok`: the `zbench run` command) and the
machine has no GPU; otherwise spawned. ZBENCH_START_METHOD=fork|spawn overrides.

SIGINT/SIGTERM during a launch: the agent stops every rank (SIGTERM, then SIGKILL after its timeout) and
`Interrupted` is raised here (zbench/interrupt.py).
"""

from __future__ import annotations

import glob
import json
import logging
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, Iterator

from .interrupt import agent_signals
from .rank_errors import input_problem


class RankFailure(RuntimeError):
    """A rank process failed; str(e) names the rank and ends with its last log lines."""

    def __init__(self, message: str, *, rank: int = -1, log_tail: str = "", exitcode: int | None = None,
                 cause: str = "") -> None:
        super().__init__(message)
        self.rank, self.log_tail, self.exitcode, self.cause = rank, log_tail, exitcode, cause


class OutOfMemory(RankFailure):
    """A rank ran out of GPU (or host) memory."""

    resource = "memory"


class OutOfDisk(OutOfMemory):
    """A rank's NVMe offload did not fit on its disk: to a batch or model search, a size that does not fit."""

    resource = "disk space"


@dataclass(frozen=True)
class Nodes:
    """Where the ranks run: this node's ranks and, for several nodes, the rendezvous."""

    nproc_per_node: int
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None  # host:port of node 0 (multi-node)
    rdzv_backend: str = "static"  # torchrun's default: node ranks as given
    rdzv_id: str = "zbench"

    def check(self) -> None:
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise ValueError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (node 0's address); pass it")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(
                f"--node-rank {self.node_rank} must be in 0..{self.nnodes - 1}; pass this node's index in that range"
            )
        if self.rdzv_backend not in ("static", "c10d"):
            raise ValueError(f"--rdzv-backend must be static or c10d, got {self.rdzv_backend!r}; pass static or c10d")


def start_method(fork_ok: bool = False) -> str:
    override = os.environ.get("ZBENCH_START_METHOD")
    if override:
        return override
    import torch

    cpu_only = torch.cuda.device_count() == 0  # NVML-based: initialises no CUDA context here
    return "fork" if fork_ok and sys.platform.startswith("linux") and cpu_only else "spawn"


def _config(nodes: Nodes, run_id: str, index: int, log_dir: str | None, fork_ok: bool) -> Any:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.launcher.api import LaunchConfig

    # no log_dir: the ranks write to this console (zbench train); else one file per rank and stream
    logs = DefaultLogsSpecs(log_dir=log_dir, redirects=Std.ALL, tee=Std.NONE) if log_dir else DefaultLogsSpecs()
    common = dict(
        nproc_per_node=nodes.nproc_per_node,
        max_restarts=0,
        monitor_interval=0.1,
        start_method=start_method(fork_ok),
        logs_specs=logs,
    )
    if nodes.nnodes == 1:
        return LaunchConfig(
            min_nodes=1, max_nodes=1, run_id=run_id, rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0", **common
        )
    host, _, port = str(nodes.rdzv_endpoint).rpartition(":")
    endpoint = f"{host}:{int(port) + index}"
    rdzv_configs = {"rank": nodes.node_rank} if nodes.rdzv_backend == "static" else {}
    return LaunchConfig(
        min_nodes=nodes.nnodes,
        max_nodes=nodes.nnodes,
        run_id=f"{nodes.rdzv_id}-{index}",
        rdzv_backend=nodes.rdzv_backend,
        rdzv_endpoint=endpoint,
        rdzv_configs=rdzv_configs,
        **common,
    )


@contextmanager
def _quiet_agent() -> Iterator[None]:
    """The agent logs each failure (and a Ctrl-C) at length; we raise one clear error instead. Its module
    loggers set their own level, so each is quieted, not only the parents."""
    prefixes = ("torch.distributed.elastic", "torch.multiprocessing")
    names = [n for n in list(logging.root.manager.loggerDict) if n.startswith(prefixes)]
    logs = [logging.getLogger(name) for name in {*prefixes, *names}]
    levels = [log.level for log in logs]
    for log in logs:
        log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for log, level in zip(logs, levels):
            log.setLevel(level)


def _tail(path: str | None, lines: int = 15) -> str:
    if not path or not os.path.isfile(path):
        return ""
    with open(path, encoding="utf-8", errors="replace") as f:
        return "".join(f.readlines()[-lines:]).rstrip()


def _is_oom(text: str, exitcode: int) -> bool:
    lowered = text.lower()
    return (
        "outofmemoryerror" in lowered
        or "out of memory" in lowered
        or "can't allocate memory" in lowered
        or exitcode == -9
    )  # SIGKILL: most often the kernel's OOM killer


def short_word(resource: str | None, oom: str = "OOM") -> str:
    """How a results row names what a launch ran out of, by its failure's `resource` (None: not known, as for a
    probe kept from a run that predates keeping it)."""
    return "Out of disk space" if resource == OutOfDisk.resource else oom


def shortfall(short: OutOfMemory | None) -> str:
    """A status line's words for it: out of disk space says where and how much (the line that says the fix)."""
    if short is None or short.resource == "memory":
        return "out of memory"
    return f"out of disk space ({short.cause.removeprefix('ValueError: ')})"


def untrained_note(last: OutOfMemory | None, batch: int) -> str:
    """A results row's note for a batch that did not train (`last`: its launch's failure, if not a kept one)."""
    if last is None:
        return f"OOM Error at batch {batch}"
    short = short_word(last.resource, "OOM Error")
    killed = f" (rank {last.rank} was SIGKILLed: most often the out-of-memory killer)" if last.exitcode == -9 else ""
    return f"{short} at batch {batch}{killed}"


def _is_out_of_disk(text: str) -> bool:
    lowered = text.lower()  # zero_core's NVMe space check, or a write that found the disk full (ENOSPC)
    return "point nvme_path at a larger disk" in lowered or "no space left on device" in lowered


def launch(
    fn: Callable[[str], Any],
    arg: str,
    nodes: Nodes,
    *,
    run_id: str,
    log_dir: str | None,
    index: int = 0,
    what: str = "job",
    fork_ok: bool = False,
) -> dict[int, Any]:
    """Run fn(arg) on this node's ranks; {global rank: return value} of the local ranks."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
    try:
        with _quiet_agent(), agent_signals():  # Ctrl-C/SIGTERM: the agent stops every rank, then Interrupted
            return elastic_launch(_config(nodes, run_id, index, log_dir, fork_ok), fn)(arg)
    except ChildFailedError as e:
        rank, failure = _cause(e)
        message = _message(failure)
        rank_dir = _rank_log_dir(log_dir, run_id, failure.local_rank)
        tail = _failure_tail(rank_dir, failure)
        first = _first_line(message, tail)
        seen = message + tail
        cls = OutOfDisk if _is_out_of_disk(seen) else OutOfMemory if _is_oom(seen, failure.exitcode) else RankFailure
        user_problem = input_problem(first)
        if user_problem:  # bad input, already said with its fix: the rank's traceback would only bury it
            raise cls(f"{what} failed on rank {rank}: {user_problem}", rank=rank, log_tail=tail,
                      exitcode=failure.exitcode, cause=user_problem) from None
        text = f"{what} failed on rank {rank} (exit code {failure.exitcode}): {first}"
        if tail:
            text += f"\n--- last log lines of rank {rank} ({rank_dir or 'console'}) ---\n{tail}"
        raise cls(text, rank=rank, log_tail=tail, exitcode=failure.exitcode, cause=first) from None


def _first_line(message: str, tail: str) -> str:
    """The failure's own first line. A rank that recorded no error gets torch's pointer to its docs instead,
    which says nothing about this failure: then what is known is said."""
    first = (message.strip().splitlines() or [""])[0]
    if first and not first.startswith("To enable traceback see"):
        return first
    return "it ended without recording an error" + (", its last log lines below" if tail else " and left no log lines")


# what a rank reports when another rank died under it: a symptom, never the cause
_PEER_LOST = ("connection closed by peer", "connection reset by peer", "remote worker crashing", "broken pipe",
              "communicator was aborted", "socket closed")


def _message(failure: Any) -> str:
    return failure.message if isinstance(failure.message, str) else str(failure.message.get("message", ""))


def _cause(error: Any) -> tuple[int, Any]:
    """The failure to report: a rank killed by a signal, else the first rank whose own error is not the loss of
    a peer (the others' errors follow from it), else the first failure."""
    rank, failure = error.get_first_failure()
    killed = sorted((r, f) for r, f in error.failures.items() if f.exitcode < 0)
    if killed:
        return killed[0] if failure.exitcode >= 0 else (rank, failure)
    if not any(p in _message(failure).lower() for p in _PEER_LOST):
        return rank, failure
    seen = list(error.failures.items())
    seen += [(rank - failure.local_rank + f.local_rank, f) for f in _unseen_errors(failure, error.failures)]
    own = sorted((f.timestamp, r, f) for r, f in seen if not any(p in _message(f).lower() for p in _PEER_LOST))
    return (own[0][1], own[0][2]) if own else (rank, failure)


def _unseen_errors(failure: Any, seen: dict) -> list[Any]:
    """Errors other local ranks recorded in their error files (beside this failure's) that the agent did not
    report: it stops the remaining ranks at the first failure it sees, which may be a peer's symptom."""
    path = getattr(failure, "error_file", None)
    attempt = os.path.dirname(os.path.dirname(path)) if path else ""
    if not attempt or not os.path.isdir(attempt):
        return []
    local = {f.local_rank for f in seen.values()}
    found = []
    for name in sorted(os.listdir(attempt)):
        error_file = os.path.join(attempt, name, "error.json")
        if not name.isdigit() or int(name) in local or not os.path.isfile(error_file):
            continue
        try:
            with open(error_file, encoding="utf-8") as f:
                data = json.load(f)  # written by our own ranks' error handler: plain JSON
            info = data["message"]
            found.append(SimpleNamespace(local_rank=int(name), exitcode=1, message=str(info["message"]),
                                         timestamp=int(info.get("extraInfo", {}).get("timestamp", 0)),
                                         error_file_data=data))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return found


def _rank_log_dir(log_dir: str | None, run_id: str, local_rank: int) -> str | None:
    if not log_dir:
        return None
    found = sorted(glob.glob(os.path.join(log_dir, f"{run_id}_*", "attempt_*", str(local_rank))))
    return found[-1] if found else None


def _failure_tail(rank_dir: str | None, failure: Any) -> str:
    """The rank's last stdout and stderr lines, then the end of the traceback its error file recorded."""
    parts = [_tail(os.path.join(rank_dir, name), 8) for name in ("stdout.log", "stderr.log")] if rank_dir else []
    data = getattr(failure, "error_file_data", None) or {}
    info = data.get("message", {}) if isinstance(data, dict) else {}
    stack = info.get("extraInfo", {}).get("py_callstack", "") if isinstance(info, dict) else ""
    if stack:
        parts.append("\n".join(stack.rstrip().splitlines()[-10:]))
    return "\n".join(p for p in parts if p)
