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
from .checkpoint import CONVERTERS
from .package_metadata import ShimDistributionFinder
from .refused import not_provided

SERVED_AS = {"accelerator.real_accelerator": "accelerator"}  # DeepSpeed's path -> zero_core's module holding it
_OWN_KERNELS = "zero_core runs its own kernels and builds none of DeepSpeed's ops"
REFUSED_MODULES = {  # DeepSpeed's modules (and all under them) zero_core lacks on purpose, and what to do instead
    "ops.op_builder": f"{_OWN_KERNELS}; use deepspeed.ops.adam's optimizers or the config's optimizer section",
    "ops.lamb": "Lamb's per-parameter trust ratio needs norms across shards, which zero_core's sharded update does "
                "not take; use AdamW or Lion (the config's optimizer.type)",
    "ops.lion": 'set the config\'s optimizer.type to "Lion" (zero_core\'s Lion, DeepSpeed\'s update rule)',
    "ops.adagrad": 'pass torch.optim.Adagrad to initialize, or set the config\'s optimizer.type to "Adagrad"',
    "ops": f"{_OWN_KERNELS} (fused layers, attention, quantizers); use the model's own layers",
    "runtime.pipe": NOT_PROVIDED["pipe"],
    "runtime.fp16": "zero_core's engine keeps the fp32 master weights and the loss scale itself (engine.optimizer, "
                    "engine.loss_scale), not through DeepSpeed's fp16 optimizers and loss scalers",
    "runtime.bf16_optimizer": "zero_core's engine keeps the fp32 master weights itself (engine.optimizer)",
    "runtime.zero.utils": "zero_core's ZeRO refusals are ValueErrors of one line (ConfigError), not "
                          "ZeRORuntimeException; catch ValueError",
    "checkpoint": CONVERTERS,
    "inference": NOT_PROVIDED["init_inference"],
    "compression": "DeepSpeed's model-compression library is not part of zero_core",
}


def refusal(name: str) -> str | None:
    """What to do instead of DeepSpeed's module `name`, where zero_core lacks it on purpose (None: no such entry).
    The longest entry that is `name` or a package above it answers."""
    parts = name.split(".")[1:]
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in REFUSED_MODULES:
            return REFUSED_MODULES[".".join(parts[:end])]
    return None


class _DeepSpeedAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: object = None, target: object = None) -> object:
        if fullname == "deepspeed" or fullname.startswith("deepspeed."):
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        top = spec.name.split(".")[1] if "." in spec.name else None
        if top in NOT_PROVIDED:
            raise not_provided(spec.name, NOT_PROVIDED[top])
        ours = SERVED_AS.get(spec.name.removeprefix("deepspeed."))
        try:
            return importlib.import_module(f"zero_core.deepspeed.{ours}" if ours else f"zero_core.{spec.name}")
        except ModuleNotFoundError as e:
            if not (e.name or "").startswith("zero_core.deepspeed"):
                raise  # something the module itself imports
            why = refusal(spec.name)
            if why:
                raise not_provided(spec.name, why) from None
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
