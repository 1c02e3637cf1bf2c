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
        self._compile_backend = "inductor"

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
        """A GPU; on the CPU, as DeepSpeed's CPU accelerator asks: whether oneDNN has fp16 kernels for this CPU
        (zero.Init without a config then builds fp16 or `dtype`, as DeepSpeed's does on it)."""
        if self._name == "cuda":
            return True
        try:
            return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
        except Exception:  # a torch build without oneDNN: DeepSpeed's answers no too
            return False

    def synchronize(self, device_index: int | None = None) -> None:
        if self._name == "cuda":
            torch.cuda.synchronize(device_index)

    # random numbers: torch's generators (CUDA's on a GPU), as DeepSpeed's accelerators hand them out
    def manual_seed(self, seed: int) -> Any:
        return torch.cuda.manual_seed(seed) if self._name == "cuda" else torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> Any:
        return torch.cuda.manual_seed_all(seed) if self._name == "cuda" else torch.manual_seed(seed)

    def random(self) -> Any:
        return torch.random

    def initial_seed(self) -> int:
        return torch.cuda.initial_seed() if self._name == "cuda" else torch.initial_seed()

    def get_rng_state(self, device_index: int | None = None) -> torch.Tensor:
        if self._name != "cuda":
            return torch.get_rng_state()
        return torch.cuda.get_rng_state() if device_index is None else torch.cuda.get_rng_state(device_index)

    def set_rng_state(self, new_state: torch.Tensor, device_index: int | None = None) -> None:
        if self._name != "cuda":
            torch.set_rng_state(new_state)
        elif device_index is None:
            torch.cuda.set_rng_state(new_state)
        else:
            torch.cuda.set_rng_state(new_state, device_index)

    def default_generator(self, device_index: int) -> torch.Generator:
        return torch.cuda.default_generators[device_index] if self._name == "cuda" else torch.default_generator

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

    # what the device is like: the CPU runs each op before the next, a GPU queues them
    def is_synchronized_device(self) -> bool:
        return self._name == "cpu"

    def use_host_timers(self) -> bool:
        return self.is_synchronized_device()

    def resolves_data_dependency(self) -> bool:
        return self.is_synchronized_device()

    def handles_memory_backpressure(self) -> bool:
        return self.is_synchronized_device()

    def device(self, device_index: int | None = None) -> Any:
        return torch.device("cuda", device_index) if self._name == "cuda" else None  # None on the CPU, as DeepSpeed

    def supported_dtypes(self) -> list[torch.dtype]:
        if self._name != "cuda":  # DeepSpeed's CPU accelerator's order
            return [torch.float32, torch.bfloat16] + ([torch.float16] if self.is_fp16_supported() else [])
        out = [torch.float32]
        if self.is_fp16_supported():
            out.append(torch.float16)
        if self.is_bf16_supported():
            out.append(torch.bfloat16)
        return out

    def is_triton_supported(self) -> bool:
        return self._name == "cuda" and torch.cuda.get_device_capability()[0] >= 8

    def lazy_call(self, callback: Any) -> Any:
        return torch.cuda._lazy_call(callback) if self._name == "cuda" else callback()

    def range_push(self, msg: str, domain: Any = None, category: Any = None) -> None:
        if self._name == "cuda":
            torch.cuda.nvtx.range_push(msg)

    def range_pop(self, domain: Any = None) -> None:
        if self._name == "cuda":
            torch.cuda.nvtx.range_pop()

    def memory_stats(self, device_index: int | None = None) -> dict:
        return torch.cuda.memory_stats(device_index) if self._name == "cuda" else {}

    def memory_cached(self, device_index: int | None = None) -> int:
        return self.memory_reserved(device_index)

    def max_memory_cached(self, device_index: int | None = None) -> int:
        return self.max_memory_reserved(device_index)

    # CUDA graphs: none on the CPU (capture is a context that does nothing)
    def create_graph(self) -> Any:
        return torch.cuda.CUDAGraph() if self._name == "cuda" else None

    def capture_to_graph(self, graph: Any, pool: Any = None, stream: Any = None) -> Any:
        return torch.cuda.graph(graph, pool, stream) if self._name == "cuda" else contextlib.nullcontext()

    def replay_graph(self, graph: Any) -> None:
        if self._name == "cuda":
            graph.replay()

    # the legacy tensor types scripts build buffers with: the device's (the CPU's are torch's own)
    def _tensor_type(self, name: str) -> Any:
        return getattr(torch.cuda if self._name == "cuda" else torch, name)

    BFloat16Tensor = property(lambda self: self._tensor_type("BFloat16Tensor"))
    ByteTensor = property(lambda self: self._tensor_type("ByteTensor"))
    DoubleTensor = property(lambda self: self._tensor_type("DoubleTensor"))
    FloatTensor = property(lambda self: self._tensor_type("FloatTensor"))
    HalfTensor = property(lambda self: self._tensor_type("HalfTensor"))
    IntTensor = property(lambda self: self._tensor_type("IntTensor"))
    LongTensor = property(lambda self: self._tensor_type("LongTensor"))

    # the launcher's view of the devices, and torch.compile's backend
    def visible_devices_envs(self) -> list[str]:
        return ["CUDA_VISIBLE_DEVICES"]

    def set_visible_devices_envs(self, current_env: dict, local_accelerator_ids: list) -> None:
        for env in self.visible_devices_envs():
            current_env[env] = ",".join(map(str, local_accelerator_ids))

    def export_envs(self) -> list[str]:
        return ["NCCL"] if self._name == "cuda" else []

    def get_compile_backend(self) -> str:
        return self._compile_backend

    def set_compile_backend(self, backend: str) -> None:
        backends = torch._dynamo.list_backends(exclude_tags=())
        if backend not in backends:
            raise ValueError(f"{backend} is not a torch.compile backend here; use one of {', '.join(backends)}")
        self._compile_backend = backend

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"get_accelerator().{name} is not provided by zero_core's accelerator; call "
                             f"torch.{self._name} (or torch) directly")


_ACCELERATOR: Accelerator | None = None
__path__: list[str] = []  # a package to the import system, as DeepSpeed's is: `deepspeed.accelerator.real_accelerator`


def get_accelerator() -> Accelerator:
    """The one accelerator object, as DeepSpeed's (a script may keep it, or set its compile backend on it)."""
    global _ACCELERATOR
    if _ACCELERATOR is None:
        _ACCELERATOR = Accelerator()
    return _ACCELERATOR
