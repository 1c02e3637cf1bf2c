"""The one-line errors of a collective that failed because a peer rank stopped, crashed or hung, and the
process group's timeout that bounds the wait (comm.py wraps every collective in `named`)."""

from __future__ import annotations

import time
from contextlib import contextmanager
from datetime import timedelta
from typing import Iterator

import torch.distributed as dist


class CollectiveError(RuntimeError):
    """A collective failed because another rank stopped, crashed or hung; str(e) is one line."""


class CollectiveTimeout(CollectiveError):
    """A collective waited longer than the process group's timeout for a peer rank."""


_TIMEOUT_HINT = "raise the collective timeout (comm_timeout_s) only if a step legitimately takes that long"


def set_timeout(seconds: float) -> None:
    """Make every later collective of the default group give up after `seconds` (gloo and NCCL)."""
    if not dist.is_initialized():
        return
    from torch.distributed import distributed_c10d as c10d

    setter = getattr(c10d, "_set_pg_timeout", None)
    if setter is None:  # torch < 2.3: the timeout is fixed when the group is created
        raise ValueError(
            "zero_core.comm_timeout_s needs torch >= 2.3 here (the process group already exists); "
            "pass timeout= to init_process_group instead, or upgrade torch"
        )
    setter(timedelta(seconds=seconds))


def translate(e: RuntimeError, what: str, waited: float) -> RuntimeError:
    """The backend's error as one line naming the rank and the collective (others unchanged)."""
    text = str(e)
    lowered = text.lower()
    who = f"rank {dist.get_rank() if dist.is_initialized() else 0}: {what}"
    if "timed out" in lowered or "timeout" in lowered:
        return CollectiveTimeout(
            f"{who} timed out after {waited:.1f} s (a peer rank stopped or hung); check the other "
            f"ranks' logs for the first error; {_TIMEOUT_HINT}"
        )
    if "closed by peer" in lowered or "reset by peer" in lowered or "broken pipe" in lowered:
        return CollectiveError(
            f"{who} failed after {waited:.1f} s: a peer rank closed its connection (it crashed or was "
            "killed); its own log names the cause; resume from the last checkpoint once it is fixed"
        )
    return e


@contextmanager
def named(what: str) -> Iterator[None]:
    start = time.monotonic()
    try:
        yield
    except RuntimeError as e:
        if isinstance(e, CollectiveError):
            raise
        err = translate(e, what, time.monotonic() - start)
        if err is e:
            raise
        raise err from e
