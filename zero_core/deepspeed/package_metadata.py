"""A "deepspeed" distribution for importlib.metadata while zero_core answers `import deepspeed` (alias.py).

Hugging Face transformers, Accelerate and Lightning check for DeepSpeed by its installed metadata
(`importlib.metadata.version("deepspeed")`, `metadata("deepspeed")`) before they use it; with no DeepSpeed
installed that check fails although `import deepspeed` works. This finder answers the name "deepspeed" with a
distribution of the DeepSpeed release whose API the shim follows, ahead of an installed DeepSpeed's, so the
version checked is the version imported. Nothing is written to disk.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import __version__

NAME = "deepspeed"
# the release number alone: version checks compare against it, and "+zero_core" would be read as a local build
VERSION = __version__.split("+")[0]
_METADATA = (
    "Metadata-Version: 2.1\n"
    f"Name: {NAME}\n"
    f"Version: {VERSION}\n"
    "Summary: zero_core.deepspeed, zbench's implementation of DeepSpeed's training API (not DeepSpeed itself)\n"
    "Author: zbench\n"
)
_FILES = {"METADATA": _METADATA, "top_level.txt": f"{NAME}\n"}


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # how distribution names compare (PEP 503)


class ShimDistribution(importlib.metadata.Distribution):
    """Metadata only: no RECORD (files() is None), no entry points."""

    def read_text(self, filename: str) -> str | None:
        return _FILES.get(filename)

    def locate_file(self, path: str | os.PathLike[str]) -> Path:
        return Path(__file__).parent / path


class ShimDistributionFinder(importlib.metadata.DistributionFinder):
    """Finds no modules (alias.py does that); finds the one distribution."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        return None

    def find_distributions(self, context: Any = None) -> Iterator[importlib.metadata.Distribution]:
        name = getattr(context, "name", None)
        if name is None or _normalized(name) == NAME:  # None: every distribution is being listed
            yield ShimDistribution()
