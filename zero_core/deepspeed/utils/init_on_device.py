"""`deepspeed.OnDevice` (also `deepspeed.utils.OnDevice`): modules built inside it get their tensors on `device`
(the meta device unless told) and their floating-point ones in `dtype`, through torch's device context and
default dtype."""

from __future__ import annotations

from typing import Any

import torch


class OnDevice:
    def __init__(self, dtype: torch.dtype, device: Any = "meta", enabled: bool = True) -> None:
        self.dtype, self.device, self.enabled = dtype, device, enabled
        self._device_context: Any = None
        self._old_dtype: torch.dtype | None = None

    def __enter__(self) -> "OnDevice":
        if self.enabled:
            self._device_context = torch.device(self.device)
            self._device_context.__enter__()
            if self.dtype is not None and self.dtype.is_floating_point:
                self._old_dtype = torch.get_default_dtype()
                torch.set_default_dtype(self.dtype)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._old_dtype is not None:
            torch.set_default_dtype(self._old_dtype)
            self._old_dtype = None
        if self._device_context is not None:
            self._device_context.__exit__(*exc)
            self._device_context = None
