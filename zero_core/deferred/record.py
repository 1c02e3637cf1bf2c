"""Build a model without memory: every tensor on the meta device, every operation on it written down.

Inside `Recorder`, factory functions default to the meta device (as `torch.device("meta")` does; `torch.tensor`
and friends stay on the CPU, since their data is the point) and a dispatch mode logs each aten operation
with the meta tensors it touched. Nothing is computed and no random number is drawn; the log is enough
to compute any tensor later (replay.py), in the order eager construction ran, so the random stream and
therefore every initial weight are the same as when the model is built eagerly with the same seed. With a dtype
(deepspeed.zero.Init's), the factories DeepSpeed's zero.Init converts make it and each finished module's
parameters are converted to it (factory_dtype.py), and the weights are then those DeepSpeed's construction
computes. The legacy `torch.Tensor(*sizes)` is recorded as `torch.empty`, and a parameter registered with a
real tensor (`nn.Parameter(torch.tensor(...))`, `torch.FloatTensor(n)`) is recorded from its value there on.

Tensors are identified by their storage: a parameter, its `.data`, its views and a Parameter wrapping
it all share one. The recorder keeps every meta tensor it saw alive, so no storage address is reused.
"""

from __future__ import annotations

import importlib
import weakref
from dataclasses import dataclass, field
from collections.abc import Iterable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from .construction_end import ConstructionEnds
from .factory_dtype import CONVERTED, convert_parameters, converted_factory, legacy_new

_KEEP_ON_CPU = {torch.tensor, torch.as_tensor, torch.asarray}  # data given by the caller: keep it real


def storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def is_meta(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "meta"


@dataclass
class Entry:
    """One aten operation: what it was called with and what it returned (meta tensors kept as they were)."""

    func: Any
    args: tuple
    kwargs: dict
    out: Any
    writes: tuple[int, ...]  # storages this operation wrote in place
    reads: tuple[int, ...]  # storages it read (a fresh output's storage is neither)
    fresh: tuple[int, ...]  # storages it created
    overwrites: bool  # it sets every byte of its one written storage without reading it
    reseed: torch.Tensor | None = None  # the CPU random state a seed set since the last entry (manual_seed inside)


@dataclass
class Recording:
    """The log of one model construction, and the CPU random state it started from."""

    entries: list[Entry] = field(default_factory=list)
    rng_start: torch.Tensor | None = None  # torch.get_rng_state() when construction began
    rng_end: torch.Tensor | None = None  # ... and when it ended (unchanged: nothing was drawn)
    known: set[int] = field(default_factory=set)
    # every module that registered a parameter or buffer while recording (weak): the model's places, found
    # without its root (GatheredParameters before initialize, early.py)
    modules: dict[int, Any] = field(default_factory=dict)

    def reseeds(self) -> list[Entry]:
        return [e for e in self.entries if e.reseed is not None]


# operations that set every element without reading the old ones (random fills draw as eager did)
_FILLS = {"normal_", "uniform_", "fill_", "zero_", "random_", "bernoulli_", "exponential_", "log_normal_",
          "cauchy_", "geometric_", "copy_"}


def _alias(x: Any) -> Any:
    return x.detach() if is_meta(x) else x


def _covers_storage(t: torch.Tensor) -> bool:
    return (t.storage_offset() == 0 and t.is_contiguous()
            and t.numel() * t.element_size() == t.untyped_storage().nbytes())


class _MetaFactories(TorchFunctionMode):
    """Factory functions without a device build on the meta device; with a `dtype`, the factories DeepSpeed's
    zero.Init converts make that dtype (factory_dtype.py)."""

    def __init__(self, dtype: torch.dtype | None) -> None:
        super().__init__()
        self.dtype = dtype

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _device_constructors() and func not in _KEEP_ON_CPU and kwargs.get("device") is None:
            kwargs["device"] = "meta"
        if self.dtype is not None and func in CONVERTED:
            return converted_factory(func, self.dtype, kwargs.get("device"))(*args, **kwargs)
        return func(*args, **kwargs)


class _Log(TorchDispatchMode):
    def __init__(self, recording: Recording) -> None:
        super().__init__()
        self.rec = recording
        self.rng_seen: torch.Tensor | None = None  # nothing is drawn while recording: a change is a new seed

    def __enter__(self) -> "_Log":
        self.rng_seen = self.rec.rng_start
        return super().__enter__()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.is_view:  # views are rebuilt from their storage at replay: nothing to compute
            return out
        ins = [a for a in tree_flatten((args, kwargs))[0] if is_meta(a)]
        if not ins and not any(is_meta(o) for o in tree_flatten(out)[0]):
            return out  # CPU work (constants); it already happened
        written = []
        for i, a in enumerate(func._schema.arguments):
            if a.alias_info is not None and a.alias_info.is_write:
                v = args[i] if i < len(args) else kwargs.get(a.name)
                if is_meta(v):
                    written.append(v)
        outs = [o for o in tree_flatten(out)[0] if is_meta(o)]
        fresh = tuple(dict.fromkeys(storage_key(o) for o in outs if storage_key(o) not in self.rec.known))
        self.rec.known.update(fresh)
        writes = tuple(dict.fromkeys(storage_key(w) for w in written))
        overwrites = (func._schema.name.split("::")[-1] in _FILLS and len(written) == 1
                      and _covers_storage(written[0]) and sum(storage_key(a) == writes[0] for a in ins) == 1)
        reads = tuple(dict.fromkeys(storage_key(a) for a in ins if not (overwrites and storage_key(a) == writes[0])))
        # aliases, not the objects: a later `p.data = ...` (zero.Init's conversion of a finished module's
        # parameters) gives the object another storage, and this operation must still replay on this one
        args, kwargs, out = tree_map(_alias, (args, kwargs, out))
        entry = Entry(func, args, kwargs, out, writes, reads, fresh, overwrites)
        state = torch.get_rng_state()
        if not torch.equal(state, self.rng_seen):
            entry.reseed = self.rng_seen = state
        self.rec.entries.append(entry)
        return out


class Recorder:
    """`with Recorder() as rec: model = Build(...)`: the model lives on the meta device and `rec.recording`
    holds everything needed to compute its initial weights. `dtype` (None: none) is the dtype zero.Init's
    factories give floating tensors and its finished modules their parameters (factory_dtype.py)."""

    def __init__(self, dtype: torch.dtype | None = None) -> None:
        self.recording = Recording()
        self.dtype = dtype
        self._modes = [_MetaFactories(dtype), _Log(self.recording)]

    def __enter__(self) -> "Recorder":
        self.recording.rng_start = torch.get_rng_state()
        importlib.import_module("torch._dynamo")  # the first factory call imports it; it reads torch.Tensor.__new__
        self._own_new = torch.Tensor.__dict__.get("__new__")  # None: torch's own, inherited
        torch.Tensor.__new__ = legacy_new(torch.Tensor.__new__)
        for m in self._modes:
            m.__enter__()
        hooks = torch.nn.modules.module
        self._hooks = [hooks.register_module_parameter_registration_hook(self._param_registered),
                       hooks.register_module_buffer_registration_hook(self._registered)]
        self._ends = ConstructionEnds(self._constructed) if self.dtype is not None else None
        if self._ends is not None:
            self._ends.__enter__()
        return self

    def _registered(self, module: torch.nn.Module, name: str, tensor: Any) -> None:
        self.recording.modules.setdefault(id(module), weakref.ref(module))

    def _param_registered(self, module: torch.nn.Module, name: str, param: Any) -> None:
        self._registered(module, name, param)
        if isinstance(param, torch.nn.Parameter) and not is_meta(param):
            _record_from_value(param)

    def _constructed(self, module: torch.nn.Module) -> None:
        """`module`'s construction has ended: zero.Init's dtype for its parameters (factory_dtype.py)."""
        convert_parameters(module.parameters(recurse=False), self.dtype, self._recorded)

    def _recorded(self, t: torch.Tensor) -> bool:
        return is_meta(t) and storage_key(t) in self.recording.known

    def __exit__(self, *exc: Any) -> None:
        try:
            if self._ends is not None:
                self._ends.__exit__(*exc)
            if self.dtype is not None and exc[0] is None:  # parameters registered after their module's end
                for module in [ref() for ref in self.recording.modules.values()]:
                    if module is not None:
                        self._constructed(module)
        finally:
            for h in self._hooks:
                h.remove()
            for m in reversed(self._modes):
                m.__exit__(*exc)
            if self._own_new is None:
                del torch.Tensor.__new__
            else:
                torch.Tensor.__new__ = self._own_new
        self.recording.rng_end = torch.get_rng_state()
        _full_sizes(self.recording)


def _record_from_value(param: torch.nn.Parameter) -> None:
    """A parameter registered with a real tensor (data given to `torch.tensor`, a legacy typed constructor) becomes a
    meta one whose recorded value is that tensor's, so initialize computes and shards it as any other; later writes
    to it record as usual. The object keeps its identity and attributes."""
    meta = param.detach().cpu().to("meta")  # recorded with the CPU value as its input: replay copies it
    kept = dict(param.__dict__)
    torch.utils.swap_tensors(param, torch.nn.Parameter(meta, requires_grad=param.requires_grad))
    param.__dict__.update(kept)


def _full_sizes(recording: Recording) -> None:
    """As DeepSpeed's zero.Init does, each parameter built here says its full size as `ds_numel` and `ds_shape`
    (scripts count the model with them); zero_core's parameters keep their full shape, so these equal numel() and
    shape. `ds_id` / `ds_status` come at stage 3's `deepspeed.initialize`, when the parameters are partitioned
    (deepspeed/runtime/zero/partition_parameters.py)."""
    for ref in recording.modules.values():
        module = ref()
        if module is not None:
            mark_full_sizes(module.parameters(recurse=False))


def mark_full_sizes(params: Iterable[torch.nn.Parameter]) -> None:
    """Set `ds_numel` and `ds_shape` (see _full_sizes) on each parameter that lacks them."""
    for p in params:
        if not hasattr(p, "ds_numel"):
            p.ds_numel, p.ds_shape = p.numel(), p.shape
