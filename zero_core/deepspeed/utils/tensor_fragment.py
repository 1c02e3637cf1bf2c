"""`deepspeed.utils.safe_get_full_fp32_param(param)`, `safe_get_full_optimizer_state(param, key)` and
`safe_get_full_grad(param)`: one parameter's whole fp32 master, Adam moment ("exp_avg", "exp_avg_sq") or gradient,
from the engine that trains it; and `safe_set_full_fp32_param(param, value)` /
`safe_set_full_optimizer_state(param, value, key)`, which write the first two.
Collective, as in DeepSpeed: every rank calls them for the same parameter (a read all-gathers its group; a write
takes the whole value on every rank and keeps this rank's share). A parameter no zero_core engine trains reads
as None, as DeepSpeed's does for one it does not partition, and is not written. At stage 3 the same holds for a
parameter whose requires_grad is False when it is called (frozen after initialize), on any number of ranks, as
DeepSpeed's ZeRO-3 answers; at stages 1-2 it reads and writes as before it was frozen, as DeepSpeed's do.

As in DeepSpeed, a write changes the fp32 state only: the 16-bit weights the forward uses follow at the next
step, which updates from the written master. With NVMe offload a write streams the whole state file once.

The local variants (`safe_get_local_fp32_param`, `safe_get_local_optimizer_state`, `safe_get_local_grad`,
`safe_set_local_fp32_param`, `safe_set_local_optimizer_state`) read and write this rank's share of the parameter
alone, without communication: a 1-D run of its flattened elements, as zero_core partitions them at every stage.
The ranks' shares, in rank order, make up the parameter once; unlike DeepSpeed's ZeRO-3 partitions they are not
of equal size and carry no padding (a rank may hold none of a parameter: an empty tensor)."""

from __future__ import annotations

from typing import Any

import torch

from ...gathered import _OWNER
from ...model_export import gathered_group, gathered_shard, settled


def _slot_of(param: torch.Tensor, name: str) -> tuple[Any, Any, Any] | None:
    """(engine, layout group, slot) of a parameter an engine trains, with `name` among its states; else None."""
    engine = _OWNER.get(id(param))
    if engine is None or (engine.stage == 3 and not param.requires_grad):  # DeepSpeed's ZeRO-3: frozen now
        return None
    found = next(((g, s) for g in engine.layout.groups for s in g.slots if engine.params[s.index] is param), None)
    if found is None:  # frozen: it has no master or moments
        return None
    states = engine.optimizer.states
    if name not in getattr(states, "names", ("master", "exp_avg", "exp_avg_sq")):
        raise ValueError(f"the optimizer keeps no {name!r} state (it keeps {', '.join(states.names)}); ask for one "
                         "of those")
    return engine, *found


def _full_state(param: torch.Tensor, name: str) -> torch.Tensor | None:
    found = _slot_of(param, name)
    if found is None:
        return None
    engine, group, slot = found
    settled(engine)  # between backward and step, or with a delayed update running: the last step's states
    full = gathered_group(engine, group, name).to(engine.device)
    return full[slot.offset : slot.offset + slot.numel].view(slot.shape).clone()


def _set_state(param: torch.Tensor, value: Any, name: str, call: str, local: bool) -> None:
    """State `name` of `param` := value: the whole parameter's (this rank keeps its share), or with `local` this
    rank's share alone."""
    found = _slot_of(param, name)
    if found is None:
        return
    engine, group, slot = found
    start, end, first = _share(engine, group, slot)
    value = torch.as_tensor(value)
    if value.is_complex() or (value.numel() != end - start if local else tuple(value.shape) != tuple(slot.shape)):
        wanted = (f"has {value.numel()} elements, this rank's share of the parameter {end - start}; pass what "
                  "safe_get_local_* returns for it, changed" if local else
                  f"is a {value.dtype} of shape {tuple(value.shape)}, the parameter a real {tuple(slot.shape)}; "
                  "pass the whole parameter's value")
        raise ValueError(f"{call}: the value {wanted}")
    settled(engine)
    flat = value.detach().reshape(-1)
    _write(engine, name, start, flat if local else flat[first : first + end - start])


def _share(engine: Any, group: Any, slot: Any) -> tuple[int, int, int]:
    """(start, end) of this rank's share of the parameter in its partition, and where that share starts in the
    parameter's flattened elements; start == end where the rank holds none of it."""
    rank = engine.rank if engine.layout.world_size > 1 else 0
    shard_lo, shard_hi = engine.layout.shard_range(group.index, rank)  # this rank's share of the group's elements
    lo, hi = max(shard_lo, slot.offset), min(shard_hi, slot.offset + slot.numel)
    start = group.partition_offset + max(lo - shard_lo, 0)
    return start, start + max(hi - lo, 0), max(lo - slot.offset, 0)


def _write(engine: Any, name: str, start: int, flat: torch.Tensor) -> None:
    """State `name` of partition elements [start, start + len(flat)) := flat."""
    end = start + flat.numel()
    for a, b, views in engine.optimizer.states.stream((name,), write_back=True):
        s, e = max(a, start), min(b, end)
        if s < e:
            views[name][s - a : e - a].copy_(flat[s - start : e - start])


def _get_local(param: torch.Tensor, name: str) -> torch.Tensor | None:
    found = _slot_of(param, "master" if name == "gradient" else name)
    if found is None:
        return None
    engine, group, slot = found
    start, end, _ = _share(engine, group, slot)
    if name == "gradient":
        if engine.gradients_ready:
            share = engine.optimizer.gradient_of(start, end) if end > start else torch.empty(0)
        else:  # inside a window: stage 3 only (DeepSpeed's defines this call for ZeRO-3 alone)
            at = group.partition_offset
            share = _window_shard(engine, group, "safe_get_local_grad")[start - at : end - at]
    else:
        settled(engine)
        share = engine.optimizer.states.read(name, start, end)
    return share.to(device=engine.device, dtype=torch.float32).clone()


def safe_get_full_grad(param: torch.Tensor) -> torch.Tensor | None:
    """The whole fp32 gradient the next step takes (averaged over ranks and accumulation steps, before clipping;
    under fp16, divided by the loss scale), between the backward that ends an accumulation window and step(); at
    stage 0 under bf16 in bf16, DeepSpeed's `.grad` there. Inside a window (after a backward that does not end it)
    at stages 0-1, this rank's gradients summed so far, each micro-step's divided by the accumulation steps, in the
    parameter's dtype, without communication: what DeepSpeed's returns there (its parameter's `.grad`); at stage 3
    the rank-averaged sum so far, fp32, gathered, as DeepSpeed's ZeRO-3 keeps it in its gradient partition. A
    parameter no engine trains gives its own `.grad`."""
    engine = _OWNER.get(id(param))
    if engine is None:
        return param.grad
    found = _slot_of(param, "master")
    if found is None:
        return None
    _, group, slot = found
    if engine.gradients_ready:
        full = gathered_group(engine, group, "gradient").to(engine.device)
    elif engine.stage == 3:
        full = gathered_shard(engine, group, _window_shard(engine, group, "safe_get_full_grad"), "gradient")
    else:
        return _window_sum(engine, slot, param)
    value = full[slot.offset : slot.offset + slot.numel].view(slot.shape).clone()
    return value.to(param.dtype) if engine.stage == 0 and param.dtype == torch.bfloat16 else value


def _window_shard(engine: Any, group: Any, call: str) -> torch.Tensor:
    """Inside an accumulation window at stage 3: this rank's shard of the group's reduced gradients summed so far,
    fp32, scaled as the step will take them. Read on request: the training path keeps the sum where it adds it
    (the optimizer's fp32 gradient, or the 16-bit sums of grad_sums.py)."""
    if engine.stage != 3:
        raise ValueError(f"{call}: inside an accumulation window this rank's share is readable at stage 3 only "
                         "(DeepSpeed defines the call for ZeRO-3 alone); call it after the backward that ends the "
                         "window, before step()")
    if engine._window_passes == 0:
        raise ValueError(f"{call}: no backward has run in this accumulation window yet; call it after a backward "
                         "(inside the window, or the one that ends it, before step())")
    sums, lo = engine.reducer.sums, group.partition_offset
    if sums is None:  # fp32 accumulation: every pass is folded into the optimizer's gradient as it arrives
        return engine.optimizer.gradient_of(lo, lo + group.shard_numel).float()
    return sums.so_far(group.index, engine.scaler.inv_scale / engine.world_size)


def _window_sum(engine: Any, slot: Any, param: torch.Tensor) -> torch.Tensor:
    """Inside an accumulation window at stages 0-1: this rank's sum so far, from the persistent bucket it is added
    into (grad_buckets.py), where the bucket holds the parameter's dtype (else the sum is not DeepSpeed's `.grad`)."""
    reducer = engine.reducer
    if not (reducer.keep_buffers and engine._window_passes > 0 and reducer.bucket_dtype == param.dtype):
        raise ValueError("safe_get_full_grad: gradients are readable after the backward that ends an accumulation "
                         "window and before step() (at stages 0-1 in the working precision and at stage 3, also after "
                         "a backward inside the window); call it there")
    bucket = reducer.buffers[slot.group]
    return bucket[slot.offset : slot.offset + slot.numel].view(slot.shape).clone()


def safe_get_full_fp32_param(param: torch.Tensor) -> torch.Tensor | None:
    return _full_state(param, "master")


def safe_get_full_optimizer_state(param: torch.Tensor, optim_state_key: str) -> torch.Tensor | None:
    _check_moment(optim_state_key)
    return _full_state(param, optim_state_key)


def safe_set_full_fp32_param(param: torch.Tensor, value: torch.Tensor) -> None:
    _set_state(param, value, "master", "safe_set_full_fp32_param", local=False)


def safe_set_full_optimizer_state(param: torch.Tensor, value: torch.Tensor, optim_state_key: str) -> None:
    _check_moment(optim_state_key)
    _set_state(param, value, optim_state_key, "safe_set_full_optimizer_state", local=False)


def _check_moment(key: str) -> None:
    if key not in ("exp_avg", "exp_avg_sq"):
        raise ValueError(f"optimizer state {key!r} is not kept by zero_core's Adam; ask for 'exp_avg' or 'exp_avg_sq'")


def safe_get_local_fp32_param(param: torch.Tensor) -> torch.Tensor | None:
    return _get_local(param, "master")


def safe_get_local_optimizer_state(param: torch.Tensor, optim_state_key: str) -> torch.Tensor | None:
    _check_moment(optim_state_key)
    return _get_local(param, optim_state_key)


def safe_get_local_grad(param: torch.Tensor) -> torch.Tensor | None:
    """This rank's share of the gradient the next step takes (as safe_get_full_grad's, read at the same point);
    inside an accumulation window at stage 3 only, where DeepSpeed's is defined (its ZeRO-3 gradient partition)."""
    return _get_local(param, "gradient")


def safe_set_local_fp32_param(param: torch.Tensor, value: torch.Tensor) -> None:
    _set_state(param, value, "master", "safe_set_local_fp32_param", local=True)


def safe_set_local_optimizer_state(param: torch.Tensor, value: torch.Tensor, optim_state_key: str) -> None:
    _check_moment(optim_state_key)
    _set_state(param, value, optim_state_key, "safe_set_local_optimizer_state", local=True)
