"""The model-states files of a DeepSpeed checkpoint: names, order, frozen parameters, buffers, ties.

ZeRO-1/2 write one `mp_rank_00_model_states.pt` holding the module's state dict in the run's
precision; ZeRO-3 writes one `zero_pp_rank_{r}_mp_rank_00_model_states.pt` per rank whose module
entries are empty placeholders. Both carry `param_shapes` (the optimizer's parameters, in flat
order), `buffer_names`, `shared_params` ({alias: owner}) and, for ZeRO-2/3, `frozen_param_shapes`
with `frozen_param_fragments` (full tensors for ZeRO-2, per-rank partitions for ZeRO-3). ZeRO-1
saves no frozen fragments: its frozen parameters are the module's own entries.
`ds_to_universal.py` copies these files next to its `zero/` folder, so both readers share this.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from .torch_file_reader import TorchFileReader
from .paths import inside
from .source import CheckpointError, ParamInfo


DEEPSPEED_KEYS = {
    "module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes", "shared_params",
    "frozen_param_fragments", "lr_scheduler", "data_sampler", "random_ltd", "sparse_tensor_module_names",
    "skipped_steps", "global_steps", "global_samples", "dp_world_size", "mp_world_size", "ds_config", "ds_version",
    "checkpoint_parallel_dimensions", "csr_tensor_module_names",
}


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


class ModelStates:
    """Parsed model-states file(s) of one tag folder; tensors are read lazily through `files`."""

    def __init__(
        self, folder: Path, files: TorchFileReader, world_size: int | None = None, follow_symlinks: bool = False
    ) -> None:
        self.folder = Path(folder)
        self.files = files
        self.zero3 = any(self.folder.glob("zero_pp_rank_*_mp_rank_00_model_states.pt"))
        first = inside(
            self.folder,
            "zero_pp_rank_0_mp_rank_00_model_states.pt" if self.zero3 else "mp_rank_00_model_states.pt",
            what="model-states file",
            follow_symlinks=follow_symlinks,
        )
        if not first.is_file():
            raise CheckpointError(f"missing rank file {first}; copy it from the run that saved this checkpoint")
        state = files.get(first)
        if not isinstance(state, dict) or "module" not in state:
            raise CheckpointError(f"{first} is not a DeepSpeed model-states file (no 'module' entry)")
        self.world_size = int(state.get("dp_world_size") or world_size or 1)
        self.paths = (
            [
                inside(
                    self.folder,
                    f"zero_pp_rank_{r}_mp_rank_00_model_states.pt",
                    what="model-states file",
                    follow_symlinks=follow_symlinks,
                )
                for r in range(self.world_size)
            ]
            if self.zero3
            else [first]
        )
        for p in self.paths:
            if not p.is_file():
                raise CheckpointError(
                    f"missing rank file {p} (world size {self.world_size}); "
                    "copy it from the run that saved this checkpoint"
                )
        self.step: int | None = state.get("global_steps")
        self.skipped: int = int(state.get("skipped_steps") or 0)
        self.lr_scheduler = state.get("lr_scheduler")
        # what the run's save_checkpoint(client_state=...) added: every key DeepSpeed does not write itself
        self.client_state = {k: v for k, v in state.items() if k not in DEEPSPEED_KEYS}
        self.ds_version: str | None = state.get("ds_version")
        config = state.get("ds_config") if isinstance(state.get("ds_config"), dict) else {}
        self.precision = (
            "bf16"
            if (config.get("bf16") or {}).get("enabled")
            else "fp16"
            if (config.get("fp16") or {}).get("enabled")
            else "fp32"
        )
        self.stage_hint = (config.get("zero_optimization") or {}).get("stage")
        self.param_shapes: list[dict[str, tuple[int, ...]]] = [
            {n: tuple(int(d) for d in s) for n, s in g.items()} for g in (state.get("param_shapes") or [])
        ]
        self.trainable = {n: s for g in self.param_shapes for n, s in g.items()}
        self.shared: dict[str, str] = dict(state.get("shared_params") or {})
        self.buffers = set(state.get("buffer_names") or [])
        self.frozen_shapes = {n: tuple(int(d) for d in s) for n, s in (state.get("frozen_param_shapes") or {}).items()}
        module = state["module"]
        frags = state.get("frozen_param_fragments") or {}
        # Names in module order (the model's state-dict order); optimizer-only names appended.
        self.order = list(module) + [n for n in self.trainable if n not in module]
        self._stored = {n: _dtype_name(frags[n] if n in frags else module[n]) for n in module}
        self._module_full = {n: tuple(module[n].shape) for n in module if not self.zero3 or n in self.buffers}

    def infos(self, trainable_dtype: str = "float32") -> list[ParamInfo]:
        """ParamInfo for every entry: optimizer params (fp32 masters), frozen params, buffers, tied aliases."""
        by_name: dict[str, ParamInfo] = {}
        for name in self.order:
            if name in self.shared:
                continue
            if name in self.trainable:
                by_name[name] = ParamInfo(name, self.trainable[name], trainable_dtype, trainable=True)
            elif name in self.frozen_shapes:
                by_name[name] = ParamInfo(
                    name, self.frozen_shapes[name], self._stored.get(name, "float32"), trainable=False
                )
            elif name in self._module_full:
                by_name[name] = ParamInfo(name, self._module_full[name], self._stored[name], trainable=False)
            else:
                raise CheckpointError(
                    f"{self.paths[0]}: {name} is in the module but its data is in no file "
                    "(saved with exclude_frozen_parameters?); it cannot be rebuilt"
                )
        for alias, owner in self.shared.items():
            if owner in by_name:
                o = by_name[owner]
                by_name[alias] = ParamInfo(alias, o.shape, o.dtype, o.trainable, tied_to=owner)
        return [by_name[n] for n in self.order if n in by_name]

    def load_untrained(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        """A frozen parameter or buffer: floating tensors as fp32, others in their own dtype."""
        if self.zero3 and name in self.frozen_shapes:
            parts = [self.files.tensor(p, self.files.get(p)["frozen_param_fragments"][name]) for p in self.paths]
            out = torch.cat([t.reshape(-1) for t in parts])[: math.prod(shape)]
        else:
            state = self.files.get(self.paths[0])
            frags = state.get("frozen_param_fragments") or {}
            out = self.files.tensor(self.paths[0], frags[name] if name in frags else state["module"][name])
        if out.numel() != math.prod(shape):
            raise CheckpointError(f"{self.paths[0]}: {name} holds {out.numel()} elements, not those of {shape}")
        out = out.reshape(shape)
        return out.float() if out.is_floating_point() else out
