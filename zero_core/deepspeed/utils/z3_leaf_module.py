"""`deepspeed.utils.set_z3_leaf_modules` and its kin: DeepSpeed's marks on modules (mixture-of-experts blocks,
say) whose whole subtree its stage 3 gathers as one unit instead of hooking each submodule. zero_core's stage 3
already gathers a whole unit (a block and everything under it) at once, whatever order its submodules run in, so
the marks are set and read back as DeepSpeed does (`_z3_leaf` on the module) and change nothing in how it
gathers."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["set_z3_leaf_modules", "unset_z3_leaf_modules", "get_z3_leaf_modules", "z3_leaf_module",
           "z3_leaf_parameter", "set_z3_leaf_module", "set_z3_leaf_modules_by_name", "set_z3_leaf_modules_by_suffix"]


def z3_leaf_module(model: torch.nn.Module) -> bool:
    return bool(getattr(model, "_z3_leaf", False))


def z3_leaf_parameter(model: torch.nn.Parameter) -> bool:
    return hasattr(model, "ds_z3_leaf_module")


def get_z3_leaf_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if z3_leaf_module(m)]


def set_z3_leaf_module(model: torch.nn.Module, flag: bool) -> None:
    model._z3_leaf = flag


def _matches(module: torch.nn.Module, kind: Any) -> bool:
    if isinstance(kind, type):
        return isinstance(module, kind)
    cls = type(module)
    return kind in (cls.__name__, f"{cls.__module__}.{cls.__qualname__}")


def _set_by_class(model: torch.nn.Module, classes: list[Any], flag: bool, raise_if_not_found: bool
                  ) -> list[torch.nn.Module]:
    if not all(isinstance(c, (type, str)) for c in classes):
        raise ValueError(f"leaf_module_classes must be a list of types or names, got {classes}")
    found = [m for m in model.modules() if any(_matches(m, c) for c in classes)]
    for m in found:
        m._z3_leaf = flag
    if not found and raise_if_not_found:
        raise ValueError(f"No modules of type {classes} found in model {type(model).__name__}")
    return found


def set_z3_leaf_modules(model: torch.nn.Module, leaf_module_classes: list[Any],
                        raise_if_not_found: bool = True) -> list[torch.nn.Module]:
    return _set_by_class(model, leaf_module_classes, True, raise_if_not_found)


def unset_z3_leaf_modules(model: torch.nn.Module, leaf_module_classes: list[Any],
                          raise_if_not_found: bool = True) -> list[torch.nn.Module]:
    return _set_by_class(model, leaf_module_classes, False, raise_if_not_found)


def set_z3_leaf_modules_by_name(model: torch.nn.Module, module_names: list[str], flag: bool = True,
                                raise_if_not_found: bool = True) -> tuple[list[torch.nn.Module], list[str]]:
    by_name = dict(model.named_modules())
    found = [by_name[n] for n in module_names if n in by_name]
    missing = [n for n in module_names if n not in by_name]
    for m in found:
        m._z3_leaf = flag
    if missing and raise_if_not_found:
        raise ValueError(f"No modules named {missing} found in model {type(model).__name__}")
    return found, missing


def set_z3_leaf_modules_by_suffix(model: torch.nn.Module, module_name_suffixes: list[str], flag: bool = True,
                                  raise_if_not_found: bool = True) -> tuple[list[torch.nn.Module], list[str]]:
    found: dict[int, torch.nn.Module] = {}
    missing = []
    for suffix in module_name_suffixes:
        hits = [m for n, m in model.named_modules() if n.endswith(suffix)]
        for m in hits:
            m._z3_leaf = flag
            found.setdefault(id(m), m)
        if not hits:
            missing.append(suffix)
    if missing and raise_if_not_found:
        raise ValueError(f"No modules matching suffixes {missing} found in model {type(model).__name__}")
    return list(found.values()), missing
