"""Stage 3: what the parameters of a released unit (param_gather.py) answer until it is gathered again.

A released unit keeps its parameters' shapes, but their storage is empty: reading an element would read freed
memory. So while its unit is released each parameter's class is `ReleasedParameter`, whose `__torch_function__`
lets through, as before, whatever reads no element (shape, dtype, device, requires_grad, grad, numel, hooks, the
`*_like` and `new_*` factories, a `.to()` that changes nothing). Any other use of it
- inside a forward of the model or of any of its modules (a submodule called on its own, as `generate()` calls the
  encoder) or inside a backward, which every rank runs alike, so that gathering is collective, first gathers the
  unit, which then stays gathered until the backward is over (until the outermost forward returns, without grad):
  as DeepSpeed gathers a parameter a forward reads outside its own module;
- anywhere else raises a ValueError naming the parameter, and how to read it (GatheredParameters on every rank).
"""

from __future__ import annotations

import sys
import weakref
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_leaves

_CALL_IMPL = torch.nn.Module._call_impl.__code__  # the frame of any module's call, hooks or not
_OWNERS: dict[int, tuple[Callable[[], Any], int, str]] = {}  # id(parameter) -> (its ReleasedReads, unit, name)

_READ_NO_ELEMENT = frozenset({
    "numel", "nelement", "size", "dim", "ndimension", "element_size", "stride", "storage_offset", "is_contiguous",
    "is_floating_point", "is_complex", "is_signed", "get_device", "__len__", "__dir__", "requires_grad_",
    "register_hook", "register_post_accumulate_grad_hook", "_is_view", "is_pinned", "is_shared", "data_ptr",
    "untyped_storage", "_has_compatible_shallow_copy_type", "empty_like", "zeros_like", "ones_like", "full_like",
    "rand_like", "randn_like", "randint_like", "new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full",
    "new_tensor",
})
_ATTRIBUTES = frozenset({  # attributes read without an element (`data`, `T`, `real`, ... alias the storage)
    "shape", "dtype", "device", "requires_grad", "grad", "is_leaf", "layout", "ndim", "names", "grad_fn", "_version",
    "is_cuda", "is_cpu", "is_meta", "is_sparse", "is_quantized", "is_mkldnn", "is_nested", "itemsize", "nbytes",
    "output_nr", "_base", "_backward_hooks", "_post_accumulate_grad_hooks",
})
_CASTS = {"float": torch.float32, "half": torch.float16, "bfloat16": torch.bfloat16, "double": torch.float64}


def _name_of(func: Any) -> str:
    """`func`'s name; an attribute's access as `.data`, its assignment as `.data=`."""
    name = getattr(func, "__name__", "")
    if name in ("__get__", "__set__", "__delete__"):
        attribute = getattr(getattr(func, "__self__", None), "__name__", "")
        return f".{attribute}" if name == "__get__" else f".{attribute}="
    return name or repr(func)


def _unchanged(name: str, args: tuple, kwargs: dict) -> bool:
    """A conversion that would return the parameter itself: it reads no element."""
    t = args[0] if args else None
    if not isinstance(t, torch.Tensor):
        return False
    if name in _CASTS:
        return t.dtype == _CASTS[name] and len(args) == 1
    if name == "cpu":
        return t.device.type == "cpu" and len(args) == 1
    if name == "contiguous":
        return t.is_contiguous() and len(args) == 1 and not kwargs
    if name != "to" or kwargs.get("copy"):
        return False
    device, dtype, _, fmt = torch._C._nn._parse_to(*args[1:], **{k: v for k, v in kwargs.items() if k != "copy"})
    same_device = device is None or (device.type == t.device.type and device.index in (None, t.device.index))
    return same_device and dtype in (None, t.dtype) and fmt in (None, torch.preserve_format)


def _reads_no_element(func: Any, args: tuple, kwargs: dict) -> bool:
    name = _name_of(func)
    if name.endswith("="):  # an assignment (of .grad, .requires_grad, .data) reads no element
        return True
    if name.startswith("."):
        return name[1:] in _ATTRIBUTES
    return name in _READ_NO_ELEMENT or _unchanged(name, args, kwargs)


class ReleasedParameter(torch.nn.Parameter):
    """A stage-3 parameter whose unit is released (see the module's docstring)."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        with torch._C.DisableTorchFunctionSubclass():
            if _reads_no_element(func, args, kwargs):
                return func(*args, **kwargs)
        for t in tree_leaves((args, kwargs)):
            if type(t) is cls:
                owner = _OWNERS.get(id(t))
                reads = owner[0]() if owner is not None else None
                if reads is None:
                    raise ValueError(f"a ZeRO stage 3 parameter of {tuple(t.shape)} was read ({_name_of(func)}) "
                                     "after its engine was gone: its weights are released")
                reads.use(owner[1], owner[2], _name_of(func))
        return func(*args, **kwargs)


class ReleasedReads:
    """Marks a unit's parameters released or gathered, and tells a forward's or backward's reads of a released
    one (gathered through `borrow(unit)`) from reads elsewhere (refused)."""

    def __init__(self, unit_params: list[list[torch.nn.Parameter]], names: list[list[str]],
                 modules: list[torch.nn.Module], borrow: Callable[[int], None], settle: Callable[[], None], *,
                 alone: bool = False, model_modules: list[torch.nn.Module] = ()) -> None:
        self.unit_params = unit_params
        self.released = [False] * len(unit_params)
        self.borrowed = [False] * len(unit_params)  # gathered for a read outside the unit's forward
        self.until_backward = [False] * len(unit_params)  # borrowed with autograd on: kept until the backward ends
        # kept whole, but holding the last step's weights while the overlapped host update writes the new ones
        self.stale = [False] * len(unit_params)
        self.alone = alone  # one rank: a gather needs no peer, so a read anywhere may gather
        self.depth = 0  # forwards of the root and the units under way
        self.borrow, self.settle = borrow, settle
        me = weakref.ref(self)
        for g, (params, ns) in enumerate(zip(unit_params, names)):
            for p, n in zip(params, ns):
                _OWNERS[id(p)] = (me, g, n)
        weakref.finalize(self, _forget, [id(p) for ps in unit_params for p in ps], me)
        self._handles = []
        self._hooked: set[int] = set()
        for m in modules:
            self._hook(m)
        # the model's other modules get the same hooks when first seen running a read of a released unit (the
        # stack shows it): two hooks on each of a model's hundreds of modules would cost every forward ~5 us each
        self._model_modules = {id(m): m for m in model_modules}

    def _hook(self, m: torch.nn.Module) -> None:
        if id(m) not in self._hooked:
            self._hooked.add(id(m))
            self._handles.append(m.register_forward_pre_hook(self._enter))
            self._handles.append(m.register_forward_hook(self._leave, always_call=True))

    def _running_model_module(self, besides: torch.nn.Module | None = None) -> torch.nn.Module | None:
        """The outermost module of the model (other than `besides`) whose call is on this thread's stack."""
        outermost, frame = None, sys._getframe(2)
        while frame is not None:
            if frame.f_code is _CALL_IMPL:
                m = frame.f_locals.get("self")
                if m is not None and m is not besides and self._model_modules.get(id(m)) is m:
                    outermost = m
            frame = frame.f_back
        return outermost

    def _enter(self, module: torch.nn.Module, args: Any) -> None:
        self.depth += 1

    def _leave(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self.depth = max(0, self.depth - 1)
        # no backward follows: borrowed units go back, unless this call runs inside a call of the model's that
        # began before its module was hooked (it did not count in the depth, and is not over)
        if self.depth == 0 and not torch.is_grad_enabled() and self._running_model_module(module) is None:
            self.settle()

    def mark_released(self, g: int) -> None:
        if not self.released[g]:
            for p in self.unit_params[g]:
                if type(p) is torch.nn.Parameter:
                    p.__class__ = ReleasedParameter
            self.released[g] = True

    def mark_stale(self, g: int) -> None:
        self.mark_released(g)
        self.stale[g] = True

    def mark_gathered(self, g: int) -> None:
        self.stale[g] = False
        if self.released[g]:
            for p in self.unit_params[g]:
                if type(p) is ReleasedParameter:
                    p.__class__ = torch.nn.Parameter
            self.released[g] = False

    def use(self, g: int, name: str, what: str) -> None:
        """Unit g's parameter `name` is about to be read (`what`): gather the unit, or refuse."""
        in_backward = torch._C._current_graph_task_id() != -1
        running = None if self.depth > 0 or in_backward else self._running_model_module()
        if running is not None:  # this call of it has no hooks (added now, they count from its next call): the
            self._hook(running)  # units it borrows go back at the next settle, or after the backward with grad
        if self.depth > 0 or in_backward or running is not None or (self.alone and self.stale[g]):
            self.borrow(g)
            self.until_backward[g] = self.until_backward[g] or in_backward or torch.is_grad_enabled()
            return
        why = ("while zero_core.overlap_weight_gather's host update still writes its unit's new weights" if
               self.stale[g] else "while its unit's weights are released")
        raise ValueError(
            f"{name} was read ({what}) at ZeRO stage 3 outside the model's forward and backward, {why} (each rank "
            "keeps only its shard; gathering them needs every rank): read it inside "
            "`with deepspeed.zero.GatheredParameters([param]):` on every rank (zero_core.deepspeed.zero), or its "
            "fp32 value with deepspeed.utils.safe_get_full_fp32_param(param)"
        )

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        _forget([id(p) for ps in self.unit_params for p in ps], weakref.ref(self))


def _forget(ids: list[int], reads: Callable[[], Any]) -> None:
    """Drop the registry's entries of `reads`' parameters (once it is removed, or gone)."""
    for i in ids:
        owner = _OWNERS.get(i)
        if owner is not None and owner[0] is reads:
            del _OWNERS[i]
