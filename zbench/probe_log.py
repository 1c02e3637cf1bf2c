"""The outcome of every batch or model-size probe, kept in the run folder so that `--resume` goes on with a
search where it stopped instead of launching every probe again (a GPT-2 XL offload probe is a minute).

variants/<name>.probes.json holds `{"setup": {...}, "fits": {"batch 48": true, ...}, "why": {"batch 64":
"out of memory"}, "resource": {"batch 64": "memory"}}`: "why" says what a probe that did not fit ran out of, in
the words of its status line, and "resource" its kind (the launch failure's `resource`: "memory", or "disk space"
for NVMe states), which a row's note is named by when every failing probe of its search is kept. A file written
before either was kept reads "did not fit", of no kind (named as out of memory).
The setup is what decides a probe's outcome besides the scenario file (which --resume already requires
unchanged): ranks, simulated ranks, nodes. A file written under another setup, or not shaped like this, is not
used: its probes run again, and the file is replaced by this run's.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable

from .printable import printable
from .run_folder import PROBE_LOG, run_path, write_atomic

MAX_PROBE_BYTES = 1 << 20


class ProbeLog:
    def __init__(self, run_dir: str, variant: str, setup: dict[str, Any], resume: bool) -> None:
        self.path = run_path(run_dir, "variants", f"{variant}{PROBE_LOG}.json")
        self.setup = setup
        self.fits: dict[str, bool] = {}
        self.why: dict[str, str] = {}
        self.resource: dict[str, str] = {}
        if resume:
            self._keep()

    def _keep(self) -> None:
        if not os.path.isfile(self.path) or os.path.islink(self.path) or os.path.getsize(self.path) > MAX_PROBE_BYTES:
            return
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, UnicodeDecodeError, ValueError, RecursionError):
            return
        if not isinstance(data, dict) or data.get("setup") != self.setup or not isinstance(data.get("fits"), dict):
            return
        self.fits = {k: v for k, v in data["fits"].items() if isinstance(k, str) and isinstance(v, bool)}
        self.why, self.resource = self._of_failed(data, "why"), self._of_failed(data, "resource")

    def _of_failed(self, data: dict[str, Any], field: str) -> dict[str, str]:
        """The file's `field` map, for kept probes that did not fit only (escaped: a status line prints it)."""
        kept = data.get(field) if isinstance(data.get(field), dict) else {}
        return {k: printable(v) for k, v in kept.items()
                if self.fits.get(k) is False and isinstance(v, str) and len(v) < 500}

    def probe(self, what: str, run: Callable[[], tuple[str, str] | None]) -> tuple[str | None, str | None, bool]:
        """(None if `what` fits, else what it ran out of; its kind, None if it fits or the file predates kinds;
        whether that was kept from an earlier run). `run` launches the probe and returns None if it fits, else
        (what it ran out of, its kind); it runs, and is recorded, only if not kept."""
        if what in self.fits:
            return self.kept_short_of(what), self.resource.get(what), True
        short_of, resource = run() or (None, None)
        self.record(what, short_of, resource)
        return short_of, resource, False

    def kept_short_of(self, what: str) -> str | None:
        """What a kept probe that did not fit ran out of ("did not fit" from a file written before reasons were
        kept); None when it fit or was not kept."""
        return None if self.fits.get(what, True) else self.why.get(what, "did not fit")

    def record(self, what: str, short_of: str | None, resource: str | None) -> None:
        """`what`'s outcome: None if it fit, else what it ran out of and its kind."""
        self.fits[what] = short_of is None
        if short_of is not None:
            self.why[what] = short_of
            if resource is not None:
                self.resource[what] = resource
        log = {"setup": self.setup, "fits": self.fits, "why": self.why, "resource": self.resource}
        write_atomic(self.path, json.dumps(log, indent=1))
