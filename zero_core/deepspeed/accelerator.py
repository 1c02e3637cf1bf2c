"""`deepspeed.accelerator.get_accelerator()` for scripts that ask it for their device: CUDA when there is a
GPU, else the CPU (DeepSpeed's `DS_ACCELERATOR=cpu`)."""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch


class Accelerator:
    def __init__(self) -> None:
        self._name = "cuda" if torch.cuda.is_available() else "cpu"

    def device_name(self, device_index: int | None = None) -> str:
        if self._name == "cpu" or device_index is None:
            return self._name
        return f"{self._name}:{device_index}"

    def current_device(self) -> int:
        return torch.cuda.current_device() if self._name == "cuda" else 0

    def current_device_name(self) -> str:
        return self.device_name(self.current_device()) if self._name == "cuda" else "cpu"

    def device_count(self) -> int:
        return torch.cuda.device_count() if self._name == "cuda" else 1

    def is_available(self) -> bool:
        return True

    def communication_backend_name(self) -> str:
        return "nccl" if self._name == "cuda" else "gloo"

    def is_bf16_supported(self) -> bool:
        return torch.cuda.is_bf16_supported() if self._name == "cuda" else True

    def is_fp16_supported(self) -> bool:
        return self._name == "cuda"

    def synchronize(self, device_index: int | None = None) -> None:
        if self._name == "cuda":
            torch.cuda.synchronize(device_index)

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def empty_cache(self) -> None:
        if self._name == "cuda":
            torch.cuda.empty_cache()

    # the memory counters scripts log: the device's caching allocator; the CPU has none of them (0)
    def memory_allocated(self, device_index: int | None = None) -> int:
        return torch.cuda.memory_allocated(device_index) if self._name == "cuda" else 0

    def max_memory_allocated(self, device_index: int | None = None) -> int:
        return torch.cuda.max_memory_allocated(device_index) if self._name == "cuda" else 0

    def memory_reserved(self, device_index: int | None = None) -> int:
        return torch.cuda.memory_reserved(device_index) if self._name == "cuda" else 0

    def max_memory_reserved(self, device_index: int | None = None) -> int:
        return torch.cuda.max_memory_reserved(device_index) if self._name == "cuda" else 0

    def reset_peak_memory_stats(self, device_index: int | None = None) -> None:
        if self._name == "cuda":
            torch.cuda.reset_peak_memory_stats(device_index)

    reset_max_memory_allocated = reset_max_memory_cached = reset_peak_memory_stats

    def total_memory(self, device_index: int | None = None) -> int:
        if self._name == "cuda":
            return torch.cuda.get_device_properties(device_index or self.current_device()).total_memory
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")  # the host's

    def available_memory(self, device_index: int | None = None) -> int:
        if self._name == "cuda":
            return torch.cuda.mem_get_info(device_index)[0]
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")

    def pin_memory(self, tensor: torch.Tensor, align_bytes: int = 1) -> torch.Tensor:
        return tensor.pin_memory() if self._name == "cuda" else tensor

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        return self._name == "cuda" and tensor.is_pinned()

    def on_accelerator(self, tensor: torch.Tensor) -> bool:
        return tensor.device.type == self._name

    def set_device(self, device_index: int) -> None:
        if self._name == "cuda":
            torch.cuda.set_device(device_index)

    # streams and events: CUDA's; on the CPU there are none (None, and a stream context that does nothing)
    @property
    def Stream(self) -> Any:  # noqa: N802 (DeepSpeed's name)
        return torch.cuda.Stream if self._name == "cuda" else None

    @property
    def Event(self) -> Any:  # noqa: N802
        return torch.cuda.Event if self._name == "cuda" else None

    def stream(self, stream: Any) -> Any:
        return torch.cuda.stream(stream) if self._name == "cuda" else contextlib.nullcontext()

    def current_stream(self, device_index: int | None = None) -> Any:
        return torch.cuda.current_stream(device_index) if self._name == "cuda" else None

    def default_stream(self, device_index: int | None = None) -> Any:
        return torch.cuda.default_stream(device_index) if self._name == "cuda" else None

    def amp(self) -> Any:
        return torch.cuda.amp if self._name == "cuda" else torch.cpu.amp

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"get_accelerator().{name} is not provided by zero_core's accelerator; call "
                             f"torch.{self._name} (or torch) directly")


def get_accelerator() -> Accelerator:
    return Accelerator()
