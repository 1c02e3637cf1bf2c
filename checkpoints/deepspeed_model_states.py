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
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from .deepspeed_pickle import REWRITE, bad_field, checked_number, shown
from .pickle_plain_types import NumpyArray, NumpyDtype, PickledNamespace
from .dtypes import name_of
from .torch_file_reader import TorchFileReader
from .paths import inside
from .source import CheckpointError, ParamInfo

MAX_COUNT = 2**53  # steps and elements: exact as floats, far past any run
MAX_WORLD = 1 << 20  # ranks: far past any run (rank_paths stops at the first rank file absent)


DEEPSPEED_KEYS = {
    "module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes", "shared_params",
    "frozen_param_fragments", "lr_scheduler", "data_sampler", "random_ltd", "sparse_tensor_module_names",
    "skipped_steps", "global_steps", "global_samples", "dp_world_size", "mp_world_size", "ds_config", "ds_version",
    "checkpoint_parallel_dimensions", "csr_tensor_module_names",
}


def _dtype_name(t: torch.Tensor) -> str:
    return name_of(t.dtype)


def _count(path: Path, state: dict, key: str, lo: int, hi: int, default: int | None, prefix: str = "") -> int | None:
    """Integer field `key` in [lo, hi], `default` when absent or None."""
    value = state.get(key)
    return default if value is None else checked_number(path, prefix + key, value, lo, hi)


def _typed(path: Path, state: dict, key: str, kind: type | tuple[type, ...], want: str, prefix: str = "") -> Any:
    """Field `key` when it is a `kind` (never a bool) or None."""
    value = state.get(key)
    if value is None or (isinstance(value, kind) and not isinstance(value, bool)):
        return value
    raise bad_field(path, prefix + key, value, want)


def _switch(path: Path, config: dict, section: str) -> bool:
    """`ds_config[section]["enabled"]`: true or false (1 and 0 too, as DeepSpeed's config reads them), off when
    absent."""
    on = (_typed(path, config, section, dict, "a dict", "ds_config.") or {}).get("enabled")
    if not isinstance(on, (bool, int, type(None))) or on not in (None, True, False):
        raise bad_field(path, f"ds_config.{section}.enabled", on, "true or false")
    return bool(on)


def _shapes(path: Path, key: str, table: Any) -> dict[str, tuple[int, ...]]:
    """{name: shape} with every dimension an integer >= 0 and at most MAX_COUNT elements per shape."""
    if not isinstance(table, dict):
        raise bad_field(path, key, table, "a dict of shapes")
    out = {}
    for name, shape in table.items():
        where = f"{key}[{shown(name)}]"
        if not isinstance(name, str) or not isinstance(shape, (list, tuple)):
            raise bad_field(path, where, shape, "a shape")
        out[name] = tuple(checked_number(path, where, d, 0, MAX_COUNT) for d in shape)
        if math.prod(out[name]) > MAX_COUNT:
            raise bad_field(path, where, out[name], f"a shape of at most {MAX_COUNT} elements")
    return out


def _names(path: Path, key: str, value: Any, pairs: bool = False) -> Any:
    """Parameter names: a list, or with `pairs` a dict {alias: owner}; empty when absent."""
    value = value if value is not None else ({} if pairs else [])
    items = [x for kv in value.items() for x in kv] if pairs and isinstance(value, dict) else value
    if not isinstance(value, dict if pairs else (list, tuple, set)) or not all(isinstance(n, str) for n in items):
        raise bad_field(path, key, value, "a dict of names" if pairs else "a list of names")
    return value


def _materialized(files: TorchFileReader, path: Path, obj: Any, done: dict[int, Any]) -> Any:
    """A copy of the loaded structure `obj` of `path` with each placeholder tensor read from the file; shared parts
    copied once. Recursion is bounded: load_pickle refused cycles and nesting deeper than MAX_DEPTH."""
    if id(obj) in done:
        return done[id(obj)]
    if isinstance(obj, torch.Tensor):
        out: Any = files.tensor(path, obj)
    elif isinstance(obj, (NumpyArray, NumpyDtype)):
        out = obj.array if isinstance(obj, NumpyArray) else obj.real()
    elif isinstance(obj, PickledNamespace):  # a script's args: its values read as any others
        out = obj.namespace({k: _materialized(files, path, v, done) for k, v in obj.attrs.items()})
    elif isinstance(obj, dict):
        out = type(obj)() if type(obj) in (dict, OrderedDict) else {}
        done[id(obj)] = out
        out.update((k, _materialized(files, path, v, done)) for k, v in obj.items())
    elif isinstance(obj, list):
        out = done[id(obj)] = []
        out.extend(_materialized(files, path, v, done) for v in obj)
    elif isinstance(obj, tuple) and type(obj) is tuple:
        out = tuple(_materialized(files, path, v, done) for v in obj)
    else:
        return obj
    done[id(obj)] = out
    return out


def rank_paths(folder: Path, name: str, world: int, follow_symlinks: bool = False) -> list[Path]:
    """`folder / name.format(r)` for each rank r < `world`, else "missing rank file" naming the first one absent:
    the walk stops there, so its work is bounded by the files on disk whatever a file says `world` is."""
    out = []
    for r in range(world):
        path = inside(folder, name.format(r), what="rank file", follow_symlinks=follow_symlinks)
        if not path.is_file():
            raise CheckpointError(
                f"missing rank file {path} (world size {world}); copy it from the run that saved this checkpoint"
            )
        out.append(path)
    return out


class ModelStates:
    """Parsed model-states file(s) of one tag folder; tensors are read lazily through `files`."""

    def __init__(
        self, folder: Path, files: TorchFileReader, rank_files: int | None = None, follow_symlinks: bool = False
    ) -> None:
        """`rank_files`: how many per-rank optimizer files lie beside, the world size where the file names none."""
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
        if not isinstance(state, dict) or not isinstance(state.get("module"), dict):
            raise CheckpointError(f"{first} is not a DeepSpeed model-states file (no 'module' entry)")
        self.world_size: int = _count(first, state, "dp_world_size", 1, MAX_WORLD, rank_files or 1)
        name = "zero_pp_rank_{}_mp_rank_00_model_states.pt"
        self.paths = rank_paths(self.folder, name, self.world_size, follow_symlinks) if self.zero3 else [first]
        self.step: int | None = _count(first, state, "global_steps", 0, MAX_COUNT, None)
        self.skipped: int = _count(first, state, "skipped_steps", 0, MAX_COUNT if self.step is None else self.step, 0)
        self.lr_scheduler = _typed(first, state, "lr_scheduler", dict, "a dict")
        # what the run's save_checkpoint(client_state=...) added: every key DeepSpeed does not write itself
        self._client_meta = {k: v for k, v in state.items() if k not in DEEPSPEED_KEYS}
        self._client: dict[str, Any] | None = None
        self.ds_version: str | None = _typed(first, state, "ds_version", str, "a version string")
        if self.ds_version is not None and (len(self.ds_version) > 64 or not self.ds_version.isprintable()):
            raise bad_field(first, "ds_version", self.ds_version, "a version string")
        config = _typed(first, state, "ds_config", dict, "a dict") or {}
        on = {k: _switch(first, config, k) for k in ("bf16", "fp16")}
        self.precision = "bf16" if on["bf16"] else "fp16" if on["fp16"] else "fp32"
        zero = _typed(first, config, "zero_optimization", dict, "a dict", "ds_config.") or {}
        self.stage_hint = _count(first, zero, "stage", 0, 3, None, "ds_config.zero_optimization.")
        groups = _typed(first, state, "param_shapes", (list, tuple), "a list of dicts") or []
        self.param_shapes: list[dict[str, tuple[int, ...]]] = [
            _shapes(first, f"param_shapes[{i}]", g) for i, g in enumerate(groups)
        ]
        self.trainable = {n: s for g in self.param_shapes for n, s in g.items()}
        self.shared: dict[str, str] = dict(_names(first, "shared_params", state.get("shared_params"), pairs=True))
        self.buffers = set(_names(first, "buffer_names", state.get("buffer_names")))
        self.frozen_shapes = _shapes(first, "frozen_param_shapes", state.get("frozen_param_shapes") or {})
        module = state["module"]
        frags = _typed(first, state, "frozen_param_fragments", dict, "a dict") or {}
        for key, table in (("module", module), ("frozen_param_fragments", frags)):
            bad = next((n for n, t in table.items() if not isinstance(n, str) or not isinstance(t, torch.Tensor)), None)
            if bad is not None:
                raise bad_field(first, f"{key}[{shown(bad)}]", table[bad], "a tensor")
        # ZeRO-2/3 keep a frozen parameter's data in the fragments (ZeRO-3: each rank's), ZeRO-1 in the module
        held = frags if self.zero3 else {**module, **frags}
        lost = next((n for n in self.frozen_shapes if n not in held and n not in self.shared), None)
        if lost is not None:
            raise CheckpointError(
                f"{first}: frozen parameter {shown(lost)} is listed in frozen_param_shapes but its data is in neither "
                f"frozen_param_fragments nor the module; {REWRITE}"
            )
        # a buffer's data is the module's own entry at every stage: one named without it would be left out
        unsaved = next((n for n in sorted(self.buffers) if n not in module), None)
        if unsaved is not None:
            raise CheckpointError(
                f"{first}: buffer {shown(unsaved)} is listed in buffer_names but the module holds no data for it; "
                f"{REWRITE}"
            )
        # Names in module order (the model's state-dict order); optimizer-only names appended.
        self.order = list(module) + [n for n in self.trainable if n not in module]
        self._stored = {n: _dtype_name(frags[n] if n in frags else module[n]) for n in module}
        self._module_full = {n: tuple(module[n].shape) for n in module if not self.zero3 or n in self.buffers}

    @property
    def client_state(self) -> dict[str, Any]:
        """What the run's save_checkpoint(client_state=...) added, its tensors read from the file (CPU tensors of
        their own, CRC-checked with the file's other reads), as DeepSpeed's load_checkpoint returns it."""
        if self._client is None:
            done: dict[int, Any] = {}
            client = _materialized(self.files, self.paths[0], self._client_meta, done)
            if any(isinstance(v, torch.Tensor) for v in done.values()):
                problems = self.files.file_problems(self.paths[0])
                if problems:
                    raise CheckpointError(f"{problems[0]}; copy the file again from the run that saved it")
            self._client = client
        return self._client

    def infos(self, trainable_dtype: str = "float32") -> list[ParamInfo]:
        """ParamInfo for every entry: optimizer params (fp32 masters), frozen params, buffers, tied aliases."""
        # an alias stands for its owner only where the owner has data of its own; one tied to itself, to another
        # alias or to a name without data keeps its own data (DeepSpeed's zero_to_fp32 keeps it too), never dropped
        has_data = {*self.trainable, *self.frozen_shapes, *self._module_full}
        tied = {a: o for a, o in self.shared.items() if a != o and o not in self.shared and o in has_data}
        by_name: dict[str, ParamInfo] = {}
        for name in self.order:
            if name in tied:
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
        for alias, owner in tied.items():
            if owner in by_name:
                o = by_name[owner]
                by_name[alias] = ParamInfo(alias, o.shape, o.dtype, o.trainable, tied_to=owner)
        return [by_name[n] for n in self.order if n in by_name]

    def load_untrained(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        """A frozen parameter or buffer: floating tensors as fp32, others in their own dtype."""
        if self.zero3 and name in self.frozen_shapes:
            parts = [self._frozen_part(p, name) for p in self.paths]
            out = torch.cat([t.reshape(-1) for t in parts])[: math.prod(shape)]
        else:
            state = self.files.get(self.paths[0])
            frags = state.get("frozen_param_fragments") or {}
            out = self.files.tensor(self.paths[0], frags[name] if name in frags else state["module"][name])
        if out.numel() != math.prod(shape):
            raise CheckpointError(f"{self.paths[0]}: {name} holds {out.numel()} elements, not those of {shape}")
        out = out.reshape(shape)
        return out.float() if out.is_floating_point() else out

    def _frozen_part(self, path: Path, name: str) -> torch.Tensor:
        """Rank file `path`'s ZeRO-3 partition of frozen parameter `name`."""
        state = self.files.get(path)
        frags = state.get("frozen_param_fragments") if isinstance(state, dict) else None
        part = frags.get(name) if isinstance(frags, dict) else None
        if not isinstance(part, torch.Tensor):
            raise bad_field(path, f"frozen_param_fragments[{shown(name)}]", part, "a tensor")
        return self.files.tensor(path, part)
