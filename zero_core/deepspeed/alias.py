"""`import deepspeed` (and `deepspeed.x.y`) answered by zero_core.deepspeed, for scripts run unmodified
(`python -m zero_core.deepspeed train.py`). A module DeepSpeed has and zero_core does not is refused on import,
in one line naming it."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from types import ModuleType

from . import NOT_PROVIDED
from .package_metadata import ShimDistributionFinder


class _DeepSpeedAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: object = None, target: object = None) -> object:
        if fullname == "deepspeed" or fullname.startswith("deepspeed."):
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        top = spec.name.split(".")[1] if "." in spec.name else None
        if top in NOT_PROVIDED:
            raise ModuleNotFoundError(f"{spec.name} is not provided by zero_core: {NOT_PROVIDED[top]}", name=spec.name)
        try:
            return importlib.import_module(f"zero_core.{spec.name}")
        except ModuleNotFoundError as e:
            if not (e.name or "").startswith("zero_core.deepspeed"):
                raise  # something the module itself imports
            raise ModuleNotFoundError(f"{spec.name} is not provided by zero_core; what it provides of DeepSpeed's API "
                                      "is listed in docs/deepspeed.md", name=spec.name) from None

    def exec_module(self, module: ModuleType) -> None:
        """Already run: it is zero_core's own module."""


def install() -> None:
    """From now on in this process, `deepspeed` means zero_core.deepspeed (ahead of an installed DeepSpeed), to
    importlib.metadata too: libraries that check DeepSpeed's installed version before importing it find the
    shim's (package_metadata.py)."""
    if not any(isinstance(f, _DeepSpeedAlias) for f in sys.meta_path):
        sys.meta_path.insert(0, _DeepSpeedAlias())
    if not any(isinstance(f, ShimDistributionFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, ShimDistributionFinder())
    for name in [n for n in sys.modules if n == "deepspeed" or n.startswith("deepspeed.")]:
        del sys.modules[name]  # an installed DeepSpeed imported earlier is not what the script gets
