"""zero_core's background threads, each finished before the interpreter is.

At exit Python stops a daemon thread the moment it takes the GIL back, and a thread inside a torch op then
unwinds through torch's C++ frames, which aborts the whole process ("terminate called without an active
exception", exit status 134). A training script's last `step()` leaves its host update running (stages/
host_step_overlap.py), so every thread zero_core starts is started here and waited for at exit; a long-lived
one (the gradient folder) is told to stop first. The threads stay daemons so that Python's own shutdown does not
wait for the long-lived ones before this hook has stopped them.
"""

from __future__ import annotations

import atexit
import threading
from typing import Callable

_running: dict[threading.Thread, Callable[[], None] | None] = {}
_lock = threading.Lock()


def start(target: Callable[[], None], name: str, stop: Callable[[], None] | None = None) -> threading.Thread:
    """Run `target` on a new thread named `name`; at exit, `stop()` (if given) and then wait for it."""

    def run() -> None:
        try:
            target()
        finally:
            with _lock:
                _running.pop(threading.current_thread(), None)

    thread = threading.Thread(target=run, name=name, daemon=True)
    with _lock:
        _running[thread] = stop
    thread.start()
    return thread


@atexit.register
def finish_all() -> None:
    """Stop the long-lived threads and wait for every thread started here (run at interpreter exit)."""
    with _lock:
        live = list(_running.items())
    for _, stop in live:
        if stop is not None:
            stop()
    for thread, _ in live:
        thread.join()
