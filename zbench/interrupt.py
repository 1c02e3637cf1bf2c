"""Ctrl-C and SIGTERM: stop the ranks, keep the run folder consistent, say how to go on.

`interruptible()` makes SIGINT/SIGTERM raise `Interrupted` in the main thread. It is a BaseException,
so no `except Exception` on the way (W&B's "never fail a run", a variant's failure row) swallows it.
While torch's elastic agent runs the ranks it installs its own handlers, which stop every rank and
then raise its SignalException; `agent_signals()` turns that into `Interrupted` and puts the previous
handlers back (the agent never does). Files the runner writes are replaced whole (run_folder.py), so
whatever finished before the signal is on disk as it was, and `--resume` goes on from there.

CPython drops an exception raised where it cannot propagate (a handler that runs inside an at-fork
callback while the launcher forks a rank, a __del__), printing "Exception ignored". Such a signal is
recorded here instead (`sys.unraisablehook`), and `raise_if_dropped()` raises it at the next point
that can: the end of the launch, the next variant.
"""

from __future__ import annotations

import signal
import sys
from contextlib import contextmanager
from typing import Any, Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
AGENT_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)  # what torch's agent takes over


class Interrupted(BaseException):
    """The user (SIGINT) or the system (SIGTERM) asked zbench to stop; `exit_code` is 128 + the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


_raised: list[int] = []  # signals raised as Interrupted by interruptible()'s handler
_dropped: list[int] = []  # signals whose exception CPython dropped


def _signal_of(exc: BaseException | None) -> int | None:
    if isinstance(exc, Interrupted):
        return exc.signum
    sigval = getattr(exc, "sigval", None)  # torch's SignalException
    return int(sigval) if type(exc).__name__ == "SignalException" and sigval is not None else None


def raise_if_dropped() -> None:
    """Raise the Interrupted that CPython dropped earlier, if any."""
    if _dropped:
        signum = _dropped[0]
        _dropped.clear()
        raise Interrupted(signum)


@contextmanager
def interruptible() -> Iterator[None]:
    """SIGINT/SIGTERM raise Interrupted; a second signal while the first unwinds is ignored (the ranks are
    being stopped: a second Ctrl-C must not leave them behind)."""
    def handler(signum: int, frame: Any) -> None:
        if _raised and not _dropped:
            return  # already unwinding
        _dropped.clear()
        _raised.append(signum)
        raise Interrupted(signum)

    def unraisable(info: Any) -> None:
        signum = _signal_of(info.exc_value)
        if signum is None:
            previous_hook(info)
        else:
            _dropped.append(signum)  # silently: it is raised again where it can propagate

    old = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    previous_hook, sys.unraisablehook = sys.unraisablehook, unraisable
    try:
        yield
    finally:
        sys.unraisablehook = previous_hook
        for sig, previous in old.items():
            signal.signal(sig, previous)
        _raised.clear()
        _dropped.clear()


@contextmanager
def agent_signals() -> Iterator[None]:
    """Around torch's elastic launch: its SignalException (raised after it stopped the ranks), or a signal
    CPython dropped meanwhile, becomes Interrupted; the handlers it installed are replaced by the previous."""
    saved = {sig: signal.getsignal(sig) for sig in AGENT_SIGNALS}
    try:
        yield
    except BaseException as e:
        signum = _signal_of(e)
        if signum is not None:
            raise Interrupted(signum) from None
        raise_if_dropped()  # a failure that follows a dropped signal (the ranks it killed) is that signal
        raise
    finally:
        for sig, handler in saved.items():
            if handler is not None:  # None: set outside Python, cannot be restored from here
                signal.signal(sig, handler)
    raise_if_dropped()
