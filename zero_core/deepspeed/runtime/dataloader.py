"""`deepspeed.runtime.dataloader.RepeatingLoader` (also `deepspeed.utils.RepeatingLoader`)."""

from __future__ import annotations

from typing import Any, Iterable


class RepeatingLoader:
    """Iterates `loader` without end: starts it again each time it is exhausted (a new epoch for a
    DataLoader whose sampler shuffles)."""

    def __init__(self, loader: Iterable[Any]) -> None:
        self.loader = loader
        self.data_iter = iter(loader)

    def __iter__(self) -> "RepeatingLoader":
        return self

    def __next__(self) -> Any:
        try:
            return next(self.data_iter)
        except StopIteration:
            self.data_iter = iter(self.loader)
            return next(self.data_iter)  # an empty loader ends here, as it would have anyway
