"""Progress bars for runs whose work happens in other processes.

Rank 0 appends small JSON lines ({"phase", "done", "total"}) to a file; the launching process tails
that file from a thread and draws rich progress bars on stderr, so stdout stays for the final table.
The launcher may fork the rank processes while the bar is drawing: drawing holds a lock that is also
taken around every fork (os.register_at_fork), so a child is never forked mid-write and can never
inherit a held stream lock. Rich's own refresh thread is off for the same reason.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from types import TracebackType
from typing import Any

_DRAW = threading.Lock()
os.register_at_fork(before=_DRAW.acquire, after_in_parent=_DRAW.release, after_in_child=_DRAW.release)


class ProgressWriter:
    """Rank 0's side: throttled appends (no device sync: only counters are written)."""

    def __init__(self, path: str | None, every_s: float = 0.2) -> None:
        self.path, self.every_s, self.last = path, every_s, 0.0

    def update(self, phase: str, done: int, total: int, force: bool = False) -> None:
        if not self.path:
            return
        now = time.monotonic()
        if not force and done < total and now - self.last < self.every_s:
            return
        self.last = now
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"phase": phase, "done": done, "total": total}) + "\n")


def make_bars(console: Any, get_time: Any = None) -> Any:
    """Rich bars: description, bar, done/total, time elapsed and the ETA (time remaining at the current rate)."""
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("ETA"), TimeRemainingColumn(), console=console, auto_refresh=False,
                    transient=not console.is_terminal, redirect_stdout=False, redirect_stderr=False, get_time=get_time)


class ProgressView:
    """The launcher's side: `with ProgressView(path, title): launch(...)` shows the bars meanwhile."""

    def __init__(self, path: str, title: str, enabled: bool = True) -> None:
        self.path, self.title, self.enabled = path, title, enabled
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "ProgressView":
        open(self.path, "w").close()
        if self.enabled and sys.stderr.isatty():  # bars only for a person watching; logs stay clean
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        from rich.console import Console

        console = Console(stderr=True)
        bars = make_bars(console)
        tasks: dict[str, int] = {}
        offset = 0
        with _DRAW:
            bars.start()
        try:
            while True:
                stopping = self._stop.wait(0.2)
                with open(self.path, encoding="utf-8") as f:
                    f.seek(offset)
                    chunk = f.read()
                complete = chunk[: chunk.rfind("\n") + 1]
                offset += len(complete.encode("utf-8"))
                for line in complete.splitlines():
                    ev = json.loads(line)
                    key = ev["phase"]
                    if key not in tasks:
                        tasks[key] = bars.add_task(f"{self.title} {key}", total=ev["total"])
                    bars.update(tasks[key], completed=ev["done"], total=ev["total"])
                with _DRAW:
                    bars.refresh()
                if stopping:
                    break
        finally:
            with _DRAW:
                bars.stop()
