"""Read a DeepSpeed universal checkpoint (the output of `ds_to_universal.py`) without DeepSpeed.

Layout: `zero/<param name>/fp32.pt` (a dict whose 'param' entry is the full fp32 tensor, or the
tensor itself), with `exp_avg.pt`, `exp_avg_sq.pt`, `step.pt` beside it, plus the source run's
model-states files copied next to `zero/`. Optimizer parameters are read from their `fp32.pt`;
frozen parameters, buffers and tied aliases from the model states (as for a ZeRO checkpoint).
Without model-states files, every `zero/*/fp32.pt` is a parameter, in name order.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from .deepspeed_model_states import ModelStates
from .deepspeed_pickle import check_zip_files
from .deepspeed_source import summarize
from .paths import inside
from .source import CheckpointError, ParamInfo, SourceSummary, step_count
from .torch_file_reader import TorchFileReader


_NO_STATES = ("{} has no model-states files beside zero/ (ds_to_universal.py copies them there, with the frozen "
              "parameters, buffers and ties)")


def is_universal_folder(folder: Path) -> bool:
    """A universal checkpoint has a `zero/` folder of per-parameter folders with `fp32.pt`."""
    return (folder / "zero").is_dir() and any((folder / "zero").glob("*/fp32.pt"))


def _param_of(obj: object, path: Path) -> torch.Tensor:
    t = obj.get("param") if isinstance(obj, dict) else obj
    if not isinstance(t, torch.Tensor):
        raise CheckpointError(f"{path} holds no 'param' tensor; it is not a universal-checkpoint parameter file")
    return t


class UniversalSource:
    """The logical per-parameter view of a DeepSpeed universal checkpoint folder."""

    kind = "deepspeed-universal"

    def __init__(self, folder: Path, follow_symlinks: bool = False) -> None:
        self.folder = Path(folder)
        self.zero = self.folder / "zero"
        self._follow = follow_symlinks
        self._files = TorchFileReader()
        has_states = (self.folder / "mp_rank_00_model_states.pt").is_file() or any(
            self.folder.glob("zero_pp_rank_*_model_states.pt")
        )
        self.model = ModelStates(self.folder, self._files, follow_symlinks=follow_symlinks) if has_states else None
        if self.model:
            self._infos = self.model.infos()
            for i in self._infos:
                if i.name in self.model.trainable and not self._fp32_path(i.name).is_file():
                    raise CheckpointError(
                        f"missing file {self._fp32_path(i.name)}; the universal checkpoint is incomplete: "
                        "run ds_to_universal.py again"
                    )
        else:
            self._infos = [
                ParamInfo(p.parent.name, tuple(_param_of(self._files.get(p), p).shape), "float32")
                for p in map(self._fp32_path, sorted(p.parent.name for p in self.zero.glob("*/fp32.pt")))
            ]
        self._by_name = {i.name: i for i in self._infos}
        # verify reads every .pt file of the folder: each must lie inside it too, links refused
        self._pt_files = [self._inside(p.relative_to(self.folder), "file") for p in sorted(self.folder.rglob("*.pt"))]

    def _inside(self, rel: str | Path, what: str) -> Path:
        return inside(self.folder, rel, what=what, follow_symlinks=self._follow)

    def _fp32_path(self, name: str) -> Path:
        return self._inside(f"zero/{name}/fp32.pt", "parameter file")

    def params(self) -> list[ParamInfo]:
        """Every state-dict entry, in the source model's order when its model states are present."""
        return list(self._infos)

    def load(self, name: str) -> torch.Tensor:
        if self.model is None:  # its frozen parameters, buffers and ties would be missing without a word
            raise CheckpointError(f"{_NO_STATES.format(self.folder)}; copy them from the checkpoint it was converted "
                                  "from")
        """The full tensor `name` on the CPU (fp32 for floating tensors)."""
        info = self._by_name[name]
        if info.tied_to:
            return self.load(info.tied_to)
        if self.model and name not in self.model.trainable:
            return self.model.load_untrained(name, info.shape)
        path = self._fp32_path(name)
        t = _param_of(self._files.get(path), path)
        if t.numel() != math.prod(info.shape):  # ZeRO-3 conversions store the flattened tensor
            raise CheckpointError(
                f"{path} holds shape {tuple(t.shape)} but the model states say {info.shape}; "
                "the folder mixes files from different conversions"
            )
        return self._files.tensor(path, t).float().reshape(info.shape)

    def load_state(self, name: str, key: str) -> torch.Tensor:
        """Adam's `key` ("exp_avg" or "exp_avg_sq") of trainable parameter `name`, full, fp32, on the CPU."""
        path = self.state_path(name, key)
        if not path.is_file():
            raise CheckpointError(f"missing file {path}; the universal checkpoint has no optimizer states for "
                                  f"{name}: run ds_to_universal.py again")
        t = _param_of(self._files.get(path), path)
        shape = self._by_name[name].shape
        if t.numel() != math.prod(shape):
            raise CheckpointError(f"{path} holds {t.numel()} elements but {name} has shape {shape}; the folder mixes "
                                  "files from different conversions")
        return self._files.tensor(path, t).float().reshape(shape)

    def state_path(self, name: str, key: str) -> Path:
        return self._inside(f"zero/{name}/{key}.pt", f"{key} file")

    def check_states(self, keys: tuple[str, ...]) -> None:
        """Every trainable parameter has its `keys` files (else one CheckpointError line)."""
        for name in self.model.trainable if self.model else (i.name for i in self._infos):
            for key in keys:
                if not self.state_path(name, key).is_file():
                    raise CheckpointError(f"missing file {self.state_path(name, key)}; load with "
                                          "load_optimizer_states=False, or run ds_to_universal.py again")

    def summary(self) -> SourceSummary:
        """Kind, the source run's step, stage and world size (when its model states are present), sizes."""
        m = self.model
        step = m.step if m else None
        if step is None:
            first = next((self._inside(p.relative_to(self.folder), "file") for p in self.zero.glob("*/step.pt")), None)
            if first:
                step = step_count(self._files.tensor(first, _param_of(self._files.get(first), first)), str(first))
        return summarize(
            self.kind,
            self.folder,
            self._infos,
            step=step,
            stage=m.stage_hint if m else None,
            world_size=m.world_size if m else None,
            extra={
                "tag": self.folder.name,
                "precision": m.precision if m else None,
                "deepspeed_version": m.ds_version if m else None,
            },
        )

    def verify(self) -> list[str]:
        """CRC-check every .pt file of the folder (torch.save's zip records carry CRCs); model-states files there."""
        return ([] if self.model else [_NO_STATES.format(self.folder)]) + check_zip_files(list(self._pt_files))

    def read_problems(self) -> list[str]:
        """CRC failures in the records read so far (checked as they were read), their unread ends finished."""
        return self._files.problems()

    def loss_scaler(self) -> None:
        """None: ds_to_universal.py keeps no loss scaler (an fp16 run's scale starts again from the config's)."""
        return None
