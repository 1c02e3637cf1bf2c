"""Tensors handed to a collective, waited for at exit until the backend's own thread has let go of them.

Gloo's work loop (NCCL's watchdog alike) drops a finished collective's tensors on its own thread, after the
caller's wait() has returned. A tensor with a Python object keeps that object alive while C++ holds it: when the
count of its C++ owners falls back to one, c10's intrusive_ptr releases the Python object, which takes the GIL, on
that thread. Once the interpreter is finalizing, a thread taking the GIL is stopped mid-frame, and the C++ frames it
unwinds through abort the process ("terminate called without an active exception", SIGABRT). A 2-rank script whose
last collectives came just before its end died so about once in 40 runs on a loaded 2-core machine. So the
collectives record weak references to the tensors they hand over, each with its count of C++ owners just before,
and at exit (atexit runs before finalization) this sleeps, letting the backend's thread take the GIL, until each
tensor is gone or back to that count, and then a little longer: the count falls before the release takes the GIL,
so a count back where it was can still have that release to come.
"""

from __future__ import annotations

import atexit
import time
import weakref
from collections import deque
from contextlib import contextmanager
from typing import Iterator

import torch

EXIT_WAIT_S = 5.0  # a tensor some other owner took meanwhile never returns to its count: give up after this
SETTLE_S = 0.1  # once counts are back: time for a release between its count falling and its taking the GIL
_handed: deque[tuple[weakref.ref, int]] = deque(maxlen=256)  # the latest collectives' tensors are what matters


@contextmanager
def backend_holds(*tensors: torch.Tensor) -> Iterator[None]:
    """Around a collective: record `tensors` (weakly) with their owner counts before the backend takes them."""
    _handed.extend((weakref.ref(t), t._use_count()) for t in tensors)
    yield


def released() -> bool:
    """Whether every recorded tensor is gone or has no more C++ owners than before its collective."""
    for ref, owners in list(_handed):
        t = ref()
        if t is not None and t._use_count() > owners:
            return False
    return True


@atexit.register
def wait_for_release(timeout_s: float = EXIT_WAIT_S) -> bool:
    """Sleep until `released()` (True) or `timeout_s` passes (False); run at interpreter exit."""
    deadline = time.monotonic() + timeout_s
    while not released():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    if any(ref() is not None for ref, _ in _handed):  # a gone tensor's release is over; a live one's may be under way
        time.sleep(SETTLE_S)
    _handed.clear()
    return True
