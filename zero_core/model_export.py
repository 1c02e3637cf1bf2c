"""The model's current weights, whole: gathered group by group from the fp32 masters (the only copy that is
current at every stage), for `engine.full_state_dict()` and `engine.save_16bit_model(dir)`.

Both are collective: every rank takes part in each group's all-gather; ranks that do not keep the result
drop it at once, so memory stays near one group plus what is kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import torch

from . import comm

if TYPE_CHECKING:
    from .engine import Engine


def settled(engine: "Engine") -> None:
    """The states as of the last step: no update in flight, none speculated, every weight gather done, and weights the
    script changed since taken where the stage keeps them (stage 0, fp32)."""
    engine._drain_updates()
    engine.wait_for_weights()
    engine.strategy.take_edited_weights()


def gathered_group(engine: "Engine", g: Any, name: str = "master") -> torch.Tensor:
    """Optimizer state `name` (or "gradient", the fp32 gradient the step will take) of layout group `g`, whole
    (collective: every rank gathers the same group)."""
    lo, hi = g.partition_offset, g.partition_offset + g.shard_numel
    opt = engine.optimizer
    shard = opt.gradient_of(lo, hi) if name == "gradient" else opt.states.read(name, lo, hi)
    return gathered_shard(engine, g, shard, "fp32 weights" if name == "master" else name)


def gathered_shard(engine: "Engine", g: Any, shard: torch.Tensor, label: str) -> torch.Tensor:
    """Every rank's fp32 `shard` of layout group `g`, concatenated (collective); `label` names it in errors."""
    if engine.layout.world_size == 1:
        return shard
    full = torch.empty(g.padded_numel, dtype=torch.float32, device=engine.device)
    comm.all_gather_flat(full, shard.to(engine.device), what=f"all-gather of {label} (group {g.index})")
    return full


def _gathered(engine: "Engine") -> Iterator[tuple[int, torch.Tensor]]:
    """(id of a trainable parameter, its full fp32 value), group by group (collective)."""
    for g in engine.layout.groups:
        full = gathered_group(engine, g)
        for s in g.slots:
            yield id(engine.params[s.index]), full[s.offset : s.offset + s.numel].view(s.shape)


def full_state_dict(engine: "Engine", dtype: torch.dtype | None = None, keep: bool = True) -> dict[str, torch.Tensor]:
    """Every state-dict entry on the CPU, keys as `module.state_dict()`: trainable ones from the masters (in
    `dtype`, else fp32), frozen parameters and buffers as the module holds them (floating ones in `dtype`, else
    fp32). `keep=False` takes part in the collectives and returns {} (ranks that write nothing)."""
    settled(engine)
    by_param = {pid: (t.to(dtype) if dtype else t).cpu().clone() for pid, t in _gathered(engine) if keep}
    if not keep:
        return {}
    out: dict[str, torch.Tensor] = {}
    for name, t in engine.module.state_dict(keep_vars=True).items():
        if id(t) in by_param:
            out[name] = by_param[id(t)]
        else:
            t = t.detach().cpu()
            out[name] = t.to(dtype or torch.float32) if t.is_floating_point() else t.clone()
    return out


def _untied(engine: "Engine", state: dict[str, torch.Tensor], exclude_frozen: bool) -> dict[str, torch.Tensor]:
    """One entry per tensor (tied names after the first dropped, as save_pretrained does), optionally no frozen ones."""
    seen: set[int] = set()
    out = {}
    for name, t in engine.module.state_dict(keep_vars=True).items():
        if id(t) in seen or (exclude_frozen and isinstance(t, torch.nn.Parameter) and not t.requires_grad):
            continue
        seen.add(id(t))
        out[name] = state[name].contiguous()
    return out


def save_model_weights(engine: "Engine", save_dir: Path, filename: str, exclude_frozen: bool) -> None:
    """Rank 0 writes `save_dir/filename` and, for a Hugging Face model, its config.json: safetensors for a
    `*.safetensors` name (tied names after the first left out, as save_pretrained does), else a torch.save of the
    plain tensors, tied names sharing one tensor, as DeepSpeed writes pytorch_model.bin (torch.load(weights_only=True)
    reads it)."""
    from safetensors.torch import save_file

    state = full_state_dict(engine, engine.dtype, keep=engine.rank == 0)
    if engine.rank == 0:
        save_dir.mkdir(parents=True, exist_ok=True)
        if filename.endswith(".safetensors"):
            save_file(_untied(engine, state, exclude_frozen), str(save_dir / filename), metadata={"format": "pt"})
        else:
            torch.save(_tied(engine, state, exclude_frozen), save_dir / filename)
        _write_config(engine.module, save_dir)
    comm.barrier("barrier after save_16bit_model")


def _tied(engine: "Engine", state: dict[str, torch.Tensor], exclude_frozen: bool) -> dict[str, torch.Tensor]:
    """Every name, a tied weight's names one tensor, optionally no frozen ones."""
    one = _untied(engine, state, exclude_frozen)
    first: dict[int, str] = {}
    out = {}
    for name, t in engine.module.state_dict(keep_vars=True).items():
        first.setdefault(id(t), name)
        if first[id(t)] in one:
            out[name] = one[first[id(t)]]
    return out


def _write_config(module: Any, save_dir: Path) -> None:
    """config.json (and generation_config.json) of a Hugging Face model, so from_pretrained opens the folder."""
    for attr in ("config", "generation_config"):
        obj = getattr(module, attr, None)
        if obj is not None and hasattr(obj, "save_pretrained") and hasattr(obj, "to_json_string"):
            obj.save_pretrained(str(save_dir))
