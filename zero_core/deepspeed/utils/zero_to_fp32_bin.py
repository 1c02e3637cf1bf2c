"""The weights as DeepSpeed's `convert_zero_checkpoint_to_state_dict` writes them by default
(`safe_serialization=False`): `pytorch_model.bin`, or past `max_shard_size` the shards
`pytorch_model-00001-of-0000N.bin` with `pytorch_model.bin.index.json` ({"metadata": {"total_size": bytes},
"weight_map": {name: file}}), each a `torch.save` of plain tensors that `torch.load(weights_only=True)` reads.
Tied names are saved once, in their owner's shard, sharing its tensor. The folder is claimed and published as
`zbench convert` publishes its output (checkpoints/output_claim.py): new or empty, renamed in when complete."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from checkpoints.consolidate import plan_shards
from checkpoints.output_claim import claimed_output
from checkpoints.source import CheckpointSource, full_state_dict


def write_pytorch_bins(source: CheckpointSource, output_dir: Path, max_shard_size: int,
                       dtype: torch.dtype = torch.float32) -> list[Path]:
    """The files written; floating-point entries in `dtype`, the others (integer buffers) as saved."""
    converted: dict[int, torch.Tensor] = {}  # by the source tensor: tied names keep sharing one converted tensor
    state = {n: converted.setdefault(id(t), t.to(dtype) if t.is_floating_point() else t)
             for n, t in full_state_dict(source).items()}
    owner: dict[int, str] = {}  # a tensor's first name: the one its size is counted and its shard chosen by
    for name, tensor in state.items():
        owner.setdefault(id(tensor), name)
    owned = [(n, t.numel() * t.element_size()) for n, t in state.items() if owner[id(t)] == n]
    shards = plan_shards(owned, max_shard_size)
    names = (["pytorch_model.bin"] if len(shards) == 1
             else [f"pytorch_model-{k + 1:05d}-of-{len(shards):05d}.bin" for k in range(len(shards))])
    file_of = {n: names[k] for k, shard in enumerate(shards) for n in shard}
    weight_map = {n: file_of[owner[id(t)]] for n, t in state.items()}
    protect = [source.folder] if hasattr(source, "folder") else []
    with claimed_output(output_dir, protect, "output_dir") as staging:
        for fname in names:
            torch.save({n: state[n].contiguous() for n in state if weight_map[n] == fname}, staging / fname)
        if len(names) > 1:
            index = {"metadata": {"total_size": sum(size for _, size in owned)},
                     "weight_map": dict(sorted(weight_map.items()))}
            (staging / "pytorch_model.bin.index.json").write_text(json.dumps(index, indent=2))
    return [output_dir / f for f in names] + ([output_dir / "pytorch_model.bin.index.json"] if len(names) > 1 else [])
