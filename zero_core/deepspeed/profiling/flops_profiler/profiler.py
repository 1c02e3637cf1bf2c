"""`deepspeed.profiling.flops_profiler`: `FlopsProfiler(model)` and `get_model_profile(model, ...)`, DeepSpeed
0.19.8's API, counted by torch's own `torch.utils.flop_counter.FlopCounterMode`.

What is counted: the operations FlopCounterMode knows, run inside a forward of the model or one of its submodules
while profiling: matrix products (mm, addmm, bmm, baddbmm, matmul, linear, einsum through them), convolutions and
attention (scaled_dot_product_attention and its kernels), 2 flops per multiply-add, and a MAC per multiply-add
(so MACs are flops / 2). For a model of those (Linear layers, attention, matmuls) the flops and MACs are DeepSpeed's
(tests/test_deepspeed_flops_profiler.py, numbers from DeepSpeed in tests/fixtures/deepspeed_small_utils.json).
Where DeepSpeed counts differently, the numbers differ:
- DeepSpeed also counts elementwise work as flops (no MACs): activations (relu, gelu, silu, ...: one per element),
  normalisations (layer_norm: 5 per element), softmax, pooling, upsampling, `torch.add`/`mul`, the bias of
  `torch.addmm`/`baddbmm` and of a convolution. These are not counted here, so flops are lower by that amount
  (an MLP's ReLU: its output's elements); the MACs agree.
- DeepSpeed gives an einsum flops without MACs; here an einsum's multiply-adds are MACs too.
- Products DeepSpeed does not intercept (a matmul inside a custom kernel's Python, `Tensor.__rmatmul__`, an RNN's
  own kernels) are counted here where torch sees them, and not there; DeepSpeed hooks RNN modules separately.
- torch 2.13's FlopCounterMode lacks the CPU attention kernel; it is given torch's own attention formula here.
Parameters are DeepSpeed's (each module's `numel()` of its parameters, shared ones once); MoE expert counts are 0.
As in DeepSpeed, each module gets `__flops__`, `__macs__`, `__params__` and `__duration__` (its own forward's
operations, not its submodules'; latency in seconds) until `end_profile()`."""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from ...utils.logging import logger
from .report import (duration_to_string, get_module_duration, get_module_flops, get_module_macs, macs_to_string,
                     number_to_string, params_to_string, print_model_profile)

_STATS = ("__flops__", "__macs__", "__params__", "__expert_params__", "__model_expert_params__", "__start_time__",
          "__duration__")


def _cpu_attention_formula() -> dict:
    """torch's own attention formula for the CPU's attention kernel, which its FlopCounterMode lacks (torch 2.13):
    scaled_dot_product_attention on the CPU runs `_scaled_dot_product_flash_attention_for_cpu`."""
    aten = torch.ops.aten
    cpu_kernel = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if cpu_kernel is None or cpu_kernel in flop_registry:
        return {}
    registered = flop_registry[aten._scaled_dot_product_flash_attention]  # takes the tensors, reads their shapes

    def cpu_attention_flops(*args: Any, **kwargs: Any) -> int:
        return registered(*args, **kwargs)

    cpu_attention_flops._get_raw = True  # FlopCounterMode's mark: already takes tensors, wrap it no further
    return {cpu_kernel: cpu_attention_flops}


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class FlopsProfiler:
    """Flops, MACs, parameters and forward latency of a model and of each of its modules, for the forwards run
    between `start_profile()` and `stop_profile()`. `ds_engine` and `recompute_fwd_factor` are kept, as DeepSpeed
    takes them; the printed profile adds the engine's world size and micro-batch size when one is given."""

    def __init__(self, model: nn.Module, ds_engine: Any = None, recompute_fwd_factor: float = 0.0) -> None:
        self.model, self.ds_engine, self.recompute_fwd_factor = model, ds_engine, recompute_fwd_factor
        self.started = self.func_patched = False
        self._counter: FlopCounterMode | None = None
        self._frames: list[list[float]] = []  # per running forward: [flops counted at entry, children's, start]
        self._handles: list[Any] = []

    def _counted(self) -> int:
        return self._counter.get_total_flops() if self._counter is not None else 0

    def _enter(self, module: nn.Module, args: Any) -> None:
        _sync()
        self._frames.append([self._counted(), 0, time.time()])

    def _leave(self, module: nn.Module, args: Any, output: Any) -> None:
        _sync()
        entered, children, started = self._frames.pop()
        inclusive = self._counted() - entered
        own = inclusive - children  # a submodule without hooks (ignored) counts as its parent's own work
        module.__flops__ += own
        module.__macs__ += own // 2  # every operation FlopCounterMode counts is 2 flops per multiply-add
        module.__duration__ += time.time() - started
        if self._frames:
            self._frames[-1][1] += inclusive

    def start_profile(self, ignore_list: list[type] | None = None) -> None:
        """Reset the counts, then count every forward of the model's modules (those of a type in `ignore_list`
        count as part of their parent) until `stop_profile()`."""
        logger.info("Flops profiler started")
        if self._counter is not None:  # started again without a stop: one set of hooks, one counter
            self.stop_profile()
        self.reset_profile()
        ignored = tuple(ignore_list or ())
        for module in self.model.modules():
            if type(module) in ignored:  # the exact type, as DeepSpeed matches it
                continue
            self._handles.append(module.register_forward_pre_hook(self._enter))
            self._handles.append(module.register_forward_hook(self._leave, always_call=True))
        self._counter = FlopCounterMode(display=False, custom_mapping=_cpu_attention_formula())
        self._counter.__enter__()
        self.started = self.func_patched = True

    def stop_profile(self) -> None:
        """Stop counting; the counts stay readable until `end_profile()`."""
        if self._counter is not None:
            self._counter.__exit__(None, None, None)
            self._counter = None
        for handle in self._handles:
            handle.remove()
        self._handles, self._frames = [], []
        self.func_patched = False

    def reset_profile(self) -> None:
        """Zero every module's counts; its parameter count is set (MoE expert counts are 0 in zero_core)."""
        for module in self.model.modules():
            module.__flops__ = module.__macs__ = module.__duration__ = module.__start_time__ = 0
            module.__params__ = sum(p.numel() for p in module.parameters())
            module.__expert_params__ = module.__model_expert_params__ = 0

    def end_profile(self) -> None:
        """Stop counting and remove the modules' counts."""
        if not self.started:
            return
        self.stop_profile()
        self.started = False
        for module in self.model.modules():
            for name in _STATS:
                module.__dict__.pop(name, None)
        logger.info("Flops profiler finished")

    def get_total_flops(self, as_string: bool = False) -> int | str:
        flops = get_module_flops(self.model)
        return number_to_string(flops) if as_string else flops

    def get_total_macs(self, as_string: bool = False) -> int | str:
        macs = get_module_macs(self.model)
        return macs_to_string(macs) if as_string else macs

    def get_total_duration(self, as_string: bool = False) -> float | str:
        duration = get_module_duration(self.model)
        return duration_to_string(duration) if as_string else duration

    def get_total_params(self, as_string: bool = False) -> int | str:
        params = self.model.__params__ + self.model.__expert_params__
        return params_to_string(params) if as_string else params

    def print_model_profile(self, profile_step: int = 1, module_depth: int = -1, top_modules: int = 1,
                            detailed: bool = True, output_file: str | None = None) -> None:
        """Print the totals, the top modules by depth and (`detailed`) the model's tree with each module's counts,
        to stdout or `output_file`; nothing unless profiling was started."""
        if not self.started:
            return
        self.flops, self.macs, self.params = self.get_total_flops(), self.get_total_macs(), self.get_total_params()
        print_model_profile(self, profile_step, module_depth, top_modules, detailed, output_file)


def _run(model: nn.Module, args: list, kwargs: dict, mode: str) -> None:
    if mode == "forward":
        model(*args, **kwargs)
    elif mode == "generate":
        model.generate(*args, **kwargs)
    else:
        raise ValueError(f"get_model_profile mode must be 'forward' or 'generate', got {mode!r}; pass one of them")


def get_model_profile(model: nn.Module, input_shape: tuple | None = None, args: list = [], kwargs: dict = {},
                      print_profile: bool = True, detailed: bool = True, module_depth: int = -1, top_modules: int = 1,
                      warm_up: int = 1, as_string: bool = True, output_file: str | None = None,
                      ignore_modules: list[type] | None = None, mode: str = "forward") -> tuple:
    """(flops, MACs, parameters) of one forward (or `generate`) of `model` in eval mode (it stays in eval mode, as
    DeepSpeed leaves it), after `warm_up` uncounted runs. `input_shape`: the model gets one tensor of that shape
    (ones in the first parameter's dtype and device; DeepSpeed's is uninitialised memory), else `args`/`kwargs`.
    As DeepSpeed's: strings `("6.14 K", "3.07 KMACs", "808")` with `as_string`, else the numbers."""
    if not isinstance(model, nn.Module):
        raise ValueError(f"get_model_profile needs a torch.nn.Module, got {type(model).__name__}; pass the model")
    model.eval()
    if input_shape is not None:
        if not isinstance(input_shape, tuple) or not input_shape:
            raise ValueError(f"input_shape must be a non-empty tuple, got {input_shape!r}; e.g. (batch, features)")
        first = next(model.parameters(), None)
        like = {"dtype": first.dtype, "device": first.device} if first is not None else {}
        args = [torch.ones(input_shape, **like)]
    if not args and not kwargs:
        raise ValueError("get_model_profile needs input_shape, args or kwargs; pass the model's inputs")
    for _ in range(warm_up):
        _run(model, list(args), dict(kwargs), mode)
    prof = FlopsProfiler(model)
    prof.start_profile(ignore_list=ignore_modules)
    try:
        _run(model, list(args), dict(kwargs), mode)
        prof.stop_profile()
        flops, macs, params = prof.get_total_flops(), prof.get_total_macs(), prof.get_total_params()
        if print_profile:
            prof.print_model_profile(profile_step=warm_up, module_depth=module_depth, top_modules=top_modules,
                                     detailed=detailed, output_file=output_file)
    finally:
        prof.end_profile()
    if as_string:
        return number_to_string(flops), macs_to_string(macs), params_to_string(params)
    return flops, macs, params
