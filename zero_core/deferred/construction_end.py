"""A call at the end of each module's construction, while a recording lasts: where DeepSpeed's zero.Init
partitions a module's parameters (converting them to its dtype), when the module's outermost `__init__` returns.

torch has no hook there, so, as DeepSpeed does, the `__init__` of every `nn.Module` class (those defined later
included) is wrapped for the duration and restored after. Only the outermost `__init__` of a construction calls
back: a subclass's `super().__init__()` is part of its construction, not the end of it.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

_CONSTRUCTING = "_zero_core_constructing"  # set on a module while its outermost __init__ runs


def _module_classes() -> list[type]:
    seen, todo = [], [torch.nn.Module]
    while todo:
        cls = todo.pop()
        if cls not in seen:
            seen.append(cls)
            todo.extend(cls.__subclasses__())
    return seen


class ConstructionEnds:
    """`with ConstructionEnds(on_end):` calls `on_end(module)` as each module's construction ends."""

    def __init__(self, on_end: Callable[[torch.nn.Module], None]) -> None:
        self.on_end = on_end
        self._originals: list[tuple[type, Any]] = []
        self._own_init_subclass: Any = None

    def _wrap(self, cls: type) -> None:
        original = cls.__dict__.get("__init__")
        if original is None:  # inherits a wrapped one
            return
        on_end = self.on_end

        @functools.wraps(original)
        def init(module: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
            if _CONSTRUCTING in module.__dict__:
                return original(module, *args, **kwargs)
            module.__dict__[_CONSTRUCTING] = True
            try:
                original(module, *args, **kwargs)
            finally:
                module.__dict__.pop(_CONSTRUCTING, None)
            on_end(module)

        cls.__init__ = init
        self._originals.append((cls, original))

    def __enter__(self) -> "ConstructionEnds":
        for cls in _module_classes():
            self._wrap(cls)
        own = self._own_init_subclass = torch.nn.Module.__dict__.get("__init_subclass__")
        wrap = self._wrap

        def init_subclass(cls: type, **kwargs: Any) -> None:  # a class defined inside the context
            if own is None:
                super(torch.nn.Module, cls).__init_subclass__(**kwargs)
            else:  # an enclosing recording's
                own.__get__(None, cls)(**kwargs)
            wrap(cls)

        torch.nn.Module.__init_subclass__ = classmethod(init_subclass)
        return self

    def __exit__(self, *exc: Any) -> None:
        for cls, original in reversed(self._originals):
            cls.__init__ = original
        self._originals.clear()
        if self._own_init_subclass is None:
            del torch.nn.Module.__init_subclass__
        else:
            torch.nn.Module.__init_subclass__ = self._own_init_subclass
