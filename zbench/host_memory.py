"""This process's host memory: resident set now and its peak.

Read from /proc/self/status on Linux (VmRSS, VmHWM). Not getrusage's ru_maxrss: Linux carries it across exec,
so a rank started by a large launcher process would report the launcher's size as its own peak."""

from __future__ import annotations

import resource
import sys


def _status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            return next((int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":")), None)
    except OSError:
        return None


def _maxrss_bytes() -> int:
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss if sys.platform == "darwin" else maxrss * 1024  # bytes on macOS, KiB elsewhere


def peak_rss_bytes() -> int:
    peak = _status_bytes("VmHWM")
    return peak if peak is not None else _maxrss_bytes()


def rss_bytes() -> int:
    now = _status_bytes("VmRSS")
    return now if now is not None else _maxrss_bytes()
