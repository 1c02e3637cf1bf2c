"""The outcome of every batch or model-size probe, kept in the run folder so that `--resume` goes on with a
search where it stopped instead of launching every probe again (a GPT-2 XL offload probe is a minute).

variants/<name>.probes.json holds `{"setup": {...}, "fits": {"batch 48": true, ...}}`. The setup is what
decides a probe's outcome besides the scenario file (which --resume already requires unchanged): ranks,
simulated ranks, nodes. A file written under another setup, or not shaped like this, is not used: its probes
run again, and the file is replaced by this run's.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable

from .run_folder import run_path, write_atomic

MAX_PROBE_BYTES = 1 << 20


class ProbeLog:
    def __init__(self, run_dir: str, variant: str, setup: dict[str, Any], resume: bool) -> None:
        self.path = run_path(run_dir, "variants", f"{variant}.probes.json")
        self.setup = setup
        self.fits = self._kept() if resume else {}

    def _kept(self) -> dict[str, bool]:
        if not os.path.isfile(self.path) or os.path.islink(self.path) or os.path.getsize(self.path) > MAX_PROBE_BYTES:
            return {}
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, UnicodeDecodeError, ValueError, RecursionError):
            return {}
        if not isinstance(data, dict) or data.get("setup") != self.setup or not isinstance(data.get("fits"), dict):
            return {}
        return {k: v for k, v in data["fits"].items() if isinstance(k, str) and isinstance(v, bool)}

    def probe(self, what: str, run: Callable[[], bool]) -> tuple[bool, bool]:
        """(whether `what` fits, whether that was kept from an earlier run); runs and records it if not kept."""
        if what in self.fits:
            return self.fits[what], True
        fits = run()
        self.record(what, fits)
        return fits, False

    def record(self, what: str, fits: bool) -> None:
        self.fits[what] = fits
        write_atomic(self.path, json.dumps({"setup": self.setup, "fits": self.fits}, indent=1))
