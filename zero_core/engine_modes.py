"""`engine.train()` / `engine.eval()` as DeepSpeed's engine answers them: they switch the wrapped model's mode
(`engine.module.training`, and every submodule's) and leave the engine's own `training` flag as it is, True
from construction on, so a script that reads `engine.training` after `engine.eval()` sees what it sees on
DeepSpeed. The model's flag is the one that changes what its forward does (dropout, batch norm)."""

from __future__ import annotations

from typing import Any


class EngineModes:
    """Mixed into `zero_core.Engine` before torch.nn.Module, whose train and eval methods these replace."""

    module: Any

    def train(self, mode: bool = True) -> Any:
        if not isinstance(mode, bool):
            raise ValueError(f"engine.train(mode) takes True or False, got {mode!r}; pass a bool")
        self.module.train(mode)
        return self  # DeepSpeed's returns None; torch's the module itself, which chained calls expect

    def eval(self) -> Any:
        return self.train(False)
