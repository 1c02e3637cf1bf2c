"""Read a torch.distributed.checkpoint (DCP) folder, e.g. saved from FSDP2, one tensor at a time.

Accepted: a folder with `.metadata` and `__{rank}_{n}.distcp` files written by `dcp.save` with the
default FileSystemWriter. Which entries are model parameters:
  - state dicts nested under "model" (`dcp.save({"model": ..., "optim": ...})`, as from
    `get_state_dict(model, optim)`): every tensor under "model", named without the prefix;
  - else under "<app>.model" (`dcp.save({"app": AppState})`, as PyTorch's DCP recipe saves), else under
    "state_dict" (Lightning's ModelParallelStrategy), or under any prefix given as `key` (`--key`);
  - otherwise the top-level tensors (`dcp.save(model.state_dict())`); nested entries such as
    optimizer state are not parameters and are skipped.
Names lose torch.compile's `_orig_mod.` and Lightning's `_forward_module.` segments, so they load
strictly into the user's model. Tied parameters are stored once per name by DCP, so each name is read on its own.
No process group is needed: each `load(name)` asks `dcp.load` (local, `no_dist`, also where the caller has a
process group) for that one key, which reads only the byte ranges of its chunks. The optimizer's per-parameter
states (`optim.state.<name>.exp_avg`, ...) are found by name for a resume (zero_core/checkpoint_dcp.py).
`.metadata` is a pickle: dcp_metadata.py unpickles it with an allowlist of DCP's own
metadata classes, so a crafted file cannot run code, then checks the types of the fields we use.
It names the chunk files: each must lie inside the folder (checkpoints.paths), and DCP's reader is
given only those checked paths, so a crafted `.metadata` cannot make us read a file elsewhere.
"""

from __future__ import annotations

import math
import pathlib
import re
import warnings
from pathlib import Path
from typing import Any

import torch

from .dcp_chunk_check import chunk_problems, held, raw_sizes
from .dcp_extensions import check_extensions
from .dcp_metadata import read_metadata
from .dtypes import name_of
from .paths import inside
from .source import CheckpointError, ParamInfo, SourceSummary, step_count


def is_dcp_folder(folder: Path) -> bool:
    """DCP's FileSystemWriter always writes `.metadata` next to its `.distcp` files."""
    return (folder / ".metadata").is_file()


_WRAPPERS = re.compile(r"(^|\.)(_orig_mod|_forward_module|_checkpoint_wrapped_module)\.")


def user_name(name: str) -> str:
    """The name as the user's model has it: without torch.compile's `_orig_mod.`, Lightning's
    `_forward_module.` or activation checkpointing's wrapper segments."""
    while (stripped := _WRAPPERS.sub(r"\1", name)) != name:
        name = stripped
    return name


def model_keys(tensors: dict[str, Any], paths: dict[str, Any], key: str | None) -> dict[str, str]:
    """parameter name -> DCP key. `key`: the entries under that dotted prefix. Otherwise those under
    "model" (`{"model": ..., "optim": ...}`), else under "<app>.model" (`{"app": AppState}`, as PyTorch's
    DCP recipe saves), else under "state_dict" (Lightning), else the top-level tensors (a bare model state dict;
    optimizer entries skipped)."""
    path_of = {k: tuple(paths.get(k) or k.split(".")) for k in tensors}
    if key is None:
        if any(p[0] == "model" and len(p) > 1 for p in path_of.values()):
            key = "model"
        elif any(p[0] == "state_dict" and len(p) > 1 for p in path_of.values()):
            key = "state_dict"  # Lightning's ModelParallelStrategy: the LightningModule's own names
        else:
            key = next((f"{p[0]}.model" for p in path_of.values() if len(p) > 2 and p[1] == "model"), None)
    if key is not None:
        prefix = key.rstrip(".") + "."
        pairs = [(user_name(k[len(prefix) :]), k) for k in tensors if k.startswith(prefix) and len(k) > len(prefix)]
    else:
        pairs = [(user_name(k), k) for k, p in path_of.items()
                 if (len(p) == 1 or k not in paths) and not re.match(r"^(optim|optimizer)(_\d+)?\.", k)]
    names: dict[str, str] = {}
    for name, k in pairs:
        if name in names:  # e.g. `emb.weight` and `_orig_mod.emb.weight`: which one is the model's is unknown
            raise CheckpointError(f"the DCP entries {names[name]!r} and {k!r} are both the parameter {name!r}; "
                                  "this save holds two models' weights: save one model's state dict")
        names[name] = k
    return names


# an optimizer's per-parameter state as get_state_dict / Accelerate / Lightning save it: `optim.state.<fqn>.exp_avg`,
# `optimizer.state.<fqn>.step`, `<app>.optim.state.<fqn>.exp_avg_sq`, `optimizer_0.state.<fqn>.exp_avg`
_STATE = re.compile(
    r"^(?:(?:.+\.)?(?:optim|optimizer)(?:_\d+)?)\.state\.(?P<fqn>.+)\.(?P<what>exp_avg|exp_avg_sq|step)$")


def state_keys(keys: Any) -> dict[str, dict[str, str]]:
    """parameter name -> {"exp_avg" / "exp_avg_sq" / "step": DCP key} of the optimizer states among `keys`."""
    found: dict[str, dict[str, str]] = {}
    for k in keys:
        m = _STATE.match(k)
        if m:
            found.setdefault(user_name(m["fqn"]), {})[m["what"]] = k
    return found


class DcpSource:
    """The logical per-parameter view of a torch.distributed.checkpoint folder."""

    kind = "dcp"
    records_roles = False  # DCP saves every entry alike: which are tied, frozen parameters or buffers is not kept

    def __init__(self, folder: Path, follow_symlinks: bool = False, key: str | None = None,
                 states_only: bool = False) -> None:
        """`states_only`: a folder of optimizer states alone (Accelerate's `optimizer_0/`), no model tensors."""
        from torch.distributed.checkpoint import FileSystemReader
        from torch.distributed.checkpoint.filesystem import FileSystem
        from torch.distributed.checkpoint.metadata import StorageMeta, TensorStorageMetadata

        self.folder = Path(folder)
        self.metadata = md = read_metadata(self.folder, follow_symlinks)
        if not isinstance(getattr(md, "storage_meta", None), StorageMeta):
            md.storage_meta = StorageMeta()
        # every chunk file checked before anything is read; DCP's reader gets only these paths
        self._paths = {
            rel: inside(self.folder, rel, what="chunk file", follow_symlinks=follow_symlinks)
            for rel in sorted({info.relative_path for info in md.storage_data.values()})
        }
        self._files = list(self._paths)
        for path in self._paths.values():
            if not path.is_file():
                raise CheckpointError(f"missing rank file {path}; copy it from the run that saved this checkpoint")
        check_extensions(self.folder, md)  # compressed chunks need their package: say so before any read
        checked = self._paths

        class _CheckedFiles(FileSystem):  # DCP opens folder / relative_path: only the checked ones exist
            def concat_path(inner, path: Any, suffix: str) -> Path:
                if suffix not in checked:
                    raise CheckpointError(f"DCP asked for {suffix!r}, a file not named in {self.folder}/.metadata")
                return checked[suffix]

        class _Reader(FileSystemReader):  # serve the safely read metadata instead of pickle.load
            def read_metadata(inner, *args: Any, **kwargs: Any) -> Any:
                md.storage_meta.load_id = inner.load_id
                return md

        self._reader = _Reader(str(self.folder))
        self._reader.fs = _CheckedFiles()
        tensors = {k: v for k, v in md.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}
        self._keys = {} if states_only else model_keys(tensors, getattr(md, "planner_data", None) or {}, key)
        self._states = state_keys(tensors)
        if not self._keys and not states_only:
            where = f"under --key {key!r}" if key else "under 'model.', '<app>.model.' or at the top level"
            firsts = ", ".join(sorted({k.split(".")[0] for k in tensors})[:5])
            raise CheckpointError(
                f"{self.folder} holds no model tensors {where} (its keys start with: {firsts}); "
                "pass --key with the prefix of the model's entries"
            )
        self._tensors = tensors
        self._raw, self._holds = raw_sizes(tensors), held(tensors)
        self._infos = [
            ParamInfo(n, tuple(tensors[k].size), name_of(tensors[k].properties.dtype))
            for n, k in self._keys.items()
        ]
        path_of = {k: tuple((getattr(md, "planner_data", None) or {}).get(k) or k.split(".")) for k in tensors}
        self._step_key = next(
            (k for k, p in path_of.items() if str(p[-1]) == "step" and math.prod(tensors[k].size) == 1), None
        )

    def params(self) -> list[ParamInfo]:
        """The model's tensors in save order, each listed as trainable and untied (DCP keeps no such marks)."""
        return list(self._infos)

    def _read(self, key: str) -> torch.Tensor:
        return self._read_many([key])[key]

    def _read_many(self, keys: list[str]) -> dict[str, torch.Tensor]:
        """Whole tensors `keys`, in one DCP load."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException  # a BaseException, not an Exception

        out = {k: self._empty(k) for k in keys}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "no process group: loading in a single process" is what we want
                dcp.load(out, storage_reader=self._reader, no_dist=True)  # local, also beside a process group
        except (Exception, CheckpointException) as e:  # DCP wraps per-rank failures in CheckpointException
            stop = _stop_in(e)
            if stop is not None:  # Ctrl-C while reading: the caller's interrupt handling, not a damaged file
                raise stop from None
            key = keys[0] if len(keys) == 1 else f"{len(keys)} tensors"
            wanted = set(keys)
            items = [(idx, i) for idx, i in self.metadata.storage_data.items() if idx.fqn in wanted]
            problems = chunk_problems(self._paths, items, self._raw, holds=self._holds) or [
                f"a file of {', '.join(sorted({i.relative_path for _, i in items}))} is unreadable"
            ]
            lines = [line for line in str(e).splitlines() if line.strip()]
            raise CheckpointError(
                f"cannot read {key}: {problems[0]} "
                f"({(lines[-1] if lines else type(e).__name__)[:100]}); copy the folder again"
            ) from None
        return out

    def _empty(self, key: str) -> torch.Tensor:
        """A tensor for `key` as its metadata describes it; one line if this machine cannot hold it."""
        shape, dtype = tuple(self._tensors[key].size), self._tensors[key].properties.dtype
        try:
            return torch.empty(shape, dtype=dtype)
        except (RuntimeError, MemoryError):
            raise CheckpointError(
                f"cannot hold {key} in memory: .metadata gives it shape {shape} of {dtype}, "
                f"{math.prod(shape) * dtype.itemsize:,} bytes; free memory or convert on a machine with more"
            ) from None

    def load(self, name: str) -> torch.Tensor:
        """The full tensor `name` on the CPU, fp32 if it is floating point."""
        t = self._read(self._keys[name])
        return t.float() if t.is_floating_point() else t

    def states(self) -> dict[str, dict[str, str]]:
        """parameter name -> its optimizer-state DCP keys (empty: the folder holds no optimizer states)."""
        return self._states

    def load_state(self, name: str, key: str) -> torch.Tensor:
        """The full fp32 optimizer state `key` ("exp_avg", "exp_avg_sq") of parameter `name`."""
        return self._read(self._states[name][key]).float()

    def check_states(self, names: list[str], keys: tuple[str, ...]) -> None:
        """Every state `keys` of every parameter `names` is in the folder, or one line naming the first missing."""
        for name in names:
            missing = next((k for k in keys if k not in self._states.get(name, {})), None)
            if missing is not None:
                raise CheckpointError(f"{self.folder} holds no optimizer {missing} of {name}; pass "
                                      "load_optimizer_states=False to load the weights alone")

    def saved_step(self) -> int | None:
        """The optimizer's step count (the largest per-parameter `step`), None without one."""
        steps = [k["step"] for k in self._states.values() if "step" in k]
        steps = [k for k in steps if math.prod(self._tensors[k].size) == 1]  # a scalar (not a fused optimizer's)
        return max(step_count(t, f"{self.folder} ({k})") for k, t in self._read_many(steps).items()) if steps else None

    def summary(self) -> SourceSummary:
        """Kind, step (from the optimizer state when saved), number of writing ranks, dtypes, size."""
        dtypes: dict[str, int] = {}
        for i in self._infos:
            dtypes[i.dtype] = dtypes.get(i.dtype, 0) + math.prod(i.shape)
        ranks = {m.group(1) for f in self._files if (m := re.match(r"__(\d+)_", pathlib.PurePath(f).name))}
        size = sum(p.stat().st_size for p in self.folder.iterdir() if p.is_file())
        step = step_count(self._read(self._step_key), f"{self.folder} ({self._step_key})") if self._step_key else None
        return SourceSummary(
            kind=self.kind,
            path=str(self.folder),
            step=step,
            stage=None,
            world_size=len(ranks) or None,
            num_params=sum(dtypes.values()),
            dtypes=dtypes,
            bytes_on_disk=size,
            extra={"files": len(self._files),
                   "optimizer states": f"for {sum(n in self._states for n in self._keys)} of {len(self._keys)} tensors",
                   },
        )

    def verify(self) -> list[str]:
        """Every chunk's bytes present and, for torch.save'd chunks, their zip CRCs intact, and no .distcp file
        holding bytes outside its chunks; one line per bad file."""
        return chunk_problems(self._paths, list(self.metadata.storage_data.items()), self._raw, every_chunk=True,
                              holds=self._holds)


def _stop_in(e: BaseException) -> BaseException | None:
    """The stop request (KeyboardInterrupt, SystemExit, zbench's Interrupted: a BaseException but not an Exception)
    that DCP wrapped, per rank and maybe nested, in the CheckpointException `e`; None for read failures."""
    from torch.distributed.checkpoint.api import CheckpointException

    if not isinstance(e, CheckpointException):
        return None if isinstance(e, Exception) else e
    wrapped = [failure for failure, _trace in e.failures.values()]
    return next((stop for failure in wrapped if (stop := _stop_in(failure)) is not None), None)
