"""Read a DeepSpeed ZeRO-1/2/3 checkpoint tag folder (e.g. `global_step1000/`) without DeepSpeed.

Files read (data-parallel world size W; tensor/pipeline parallel size 1):
  model states (see deepspeed_model_states.py): names, order, frozen parameters, buffers, ties
  `[bf16_]zero_pp_rank_{r}_mp_rank_00_optim_states.pt` for r < W: the fp32 master partitions,
      `single_partition_of_fp32_groups` (ZeRO-1/2) or `fp32_flat_groups` (ZeRO-3); where each
      parameter lives in them is worked out by deepspeed_layout.py
Trainable parameters come from the fp32 masters, whatever the run's precision (fp32, bf16, fp16).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import torch

from . import deepspeed_layout as layout
from .deepspeed_layout import MAX_NUMEL
from .deepspeed_model_states import ModelStates, rank_paths
from .deepspeed_pickle import REWRITE, check_zip_files, checked_number, shown
from .source import CheckpointError, ParamInfo, SourceSummary
from .torch_file_reader import TorchFileReader

_CHUNK = 1 << 23  # elements per positioned read (32 MiB of fp32)
OPTIM_RE = re.compile(r"^(bf16_|fp16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")


def is_deepspeed_folder(folder: Path) -> bool:
    """A DeepSpeed tag folder holds model-states or ZeRO optimizer files (and no universal `zero/` folder)."""
    return not (folder / "zero").is_dir() and (
        any(folder.glob("*_model_states.pt")) or any(folder.glob("*zero_pp_rank_*_optim_states.pt"))
    )


def summarize(kind: str, folder: Path, infos: list[ParamInfo], **fields) -> SourceSummary:
    """A SourceSummary with dtype element counts (tied names counted once) and the folder's size on disk."""
    dtypes: dict[str, int] = {}
    for i in infos:
        if not i.tied_to:
            dtypes[i.dtype] = dtypes.get(i.dtype, 0) + math.prod(i.shape)
    size = sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file())
    return SourceSummary(
        kind=kind, path=str(folder), num_params=sum(dtypes.values()), dtypes=dtypes, bytes_on_disk=size, **fields
    )


class DeepSpeedSource:
    """The logical per-parameter view of one DeepSpeed ZeRO checkpoint tag folder."""

    kind = "deepspeed"

    def __init__(self, folder: Path, follow_symlinks: bool = False) -> None:
        self.folder = Path(folder)
        self._files = TorchFileReader()
        optim = self._find_optim_files()
        self.model = ModelStates(self.folder, self._files, rank_files=len(optim), follow_symlinks=follow_symlinks)
        self.world_size = self.model.world_size
        prefix = optim[min(optim)].name.split("zero_pp_rank_")[0]
        name = prefix + "zero_pp_rank_{}_mp_rank_00_optim_states.pt"
        self.optim_files = rank_paths(self.folder, name, self.world_size, follow_symlinks)
        metas = [self._meta(f) for f in self.optim_files]
        self.stage = self._stage(metas)
        self._check_partition_counts(metas)
        self._group_key = "fp32_flat_groups" if self.stage == 3 else "single_partition_of_fp32_groups"
        sizes = [[int(t.numel()) for t in self._groups(f, m)] for f, m in zip(self.optim_files, metas)]
        shapes = self.model.param_shapes
        odd = next((f for f, s in zip(self.optim_files, sizes) if len(s) != len(shapes)), None)
        if self.stage == 3:
            self._pieces = layout.stage3_pieces(shapes, self.world_size)
        elif odd is not None:  # ZeRO-1/2 keep one partition per param group, in step with param_shapes
            raise CheckpointError(f"{odd}: {self._group_key} holds {len(sizes[self.optim_files.index(odd)])} "
                                  f"partitions but {self.model.paths[0]} has {len(shapes)} param groups; {REWRITE}")
        elif all("param_slice_mappings" in m for m in metas):
            mappings = [layout.checked_mappings(f, m["param_slice_mappings"], len(s))
                        for f, m, s in zip(self.optim_files, metas, sizes)]
            self._pieces = layout.stage12_from_mappings(mappings, sizes)
        else:
            pads = layout.checked_paddings(self.optim_files[0], metas[0].get("param_alignment_paddings"), shapes)
            self._pieces = layout.stage12_from_offsets(shapes, pads, sizes)
        for name in self.model.trainable:  # empty parameters have no fragment in the mappings
            self._pieces.setdefault(name, [])
        layout.check_pieces(self._pieces, self.model.trainable, [sum(s) for s in sizes], str(self.folder))
        self.precision = "bf16" if prefix == "bf16_" else self.model.precision
        self._infos = self.model.infos()
        self._by_name = {i.name: i for i in self._infos}

    def _meta(self, path: Path) -> dict:
        """The `optimizer_state_dict` of rank file `path`."""
        saved = self._files.get(path)
        meta = saved.get("optimizer_state_dict") if isinstance(saved, dict) else None
        if not isinstance(meta, dict):
            raise CheckpointError(f"{path} is not a DeepSpeed optimizer-states file (no 'optimizer_state_dict' entry); "
                                  "copy it again from the run that saved this checkpoint")
        return meta

    def saved_param_groups(self) -> list[dict] | None:
        """The param_groups (plain data, unchecked) of the optimizer state rank 0 saved, or None without them."""
        meta = self._meta(self.optim_files[0])
        inner = meta.get("base_optimizer_state" if self.stage < 3 else "optimizer_state_dict")
        groups = inner.get("param_groups") if isinstance(inner, dict) else None
        return groups if isinstance(groups, list) and all(isinstance(g, dict) for g in groups) else None

    def _stage(self, metas: list[dict]) -> int:
        """The ZeRO stage every rank file names (DeepSpeed's ZeroStageEnum loads as its plain int value)."""
        for f, m in zip(self.optim_files, metas):
            stage = m.get("zero_stage", 0)
            if isinstance(stage, int) and not isinstance(stage, bool) and stage not in (1, 2, 3):
                raise CheckpointError(f"{f}: ZeRO stage {shown(stage)} checkpoints are not supported (only 1, 2, 3)")
            if checked_number(f, "zero_stage", stage, 1, 3) != metas[0]["zero_stage"]:
                raise layout.bad_field(f, "zero_stage", stage, f"{metas[0]['zero_stage']}, as in the other rank files")
        return metas[0]["zero_stage"]

    def _check_partition_counts(self, metas: list[dict]) -> None:
        """Each rank file's `partition_count` (ZeRO-1/2: one per group; ZeRO-3: one) names as many ranks as there
        are rank files, as DeepSpeed's own reader requires: a file from a save on another world size is refused."""
        for f, m in zip(self.optim_files, metas):
            counts = m.get("partition_count")
            if counts is None:  # not recorded: the sizes of the partitions are checked below all the same
                continue
            for count in counts if isinstance(counts, (list, tuple)) else [counts]:
                if checked_number(f, "partition_count", count, 1, 1 << 20) != self.world_size:
                    raise CheckpointError(
                        f"{f}: partition_count says the save had {count} ranks, but the checkpoint has "
                        f"{self.world_size} rank files; {REWRITE}"
                    )

    def _groups(self, path: Path, meta: dict) -> list[torch.Tensor]:
        """Rank file `path`'s fp32 partitions (torch's loader holds each within its record of the file)."""
        groups = meta.get(self._group_key)
        if not isinstance(groups, (list, tuple)) or not all(isinstance(t, torch.Tensor) for t in groups):
            raise layout.bad_field(path, self._group_key, groups, "a list of tensors")
        odd = next((t for t in groups if not t.is_contiguous()), None)
        if odd is not None:  # DeepSpeed saves flat partitions: a strided one (an expanded view) is no partition
            raise CheckpointError(f"{path}: a tensor of {self._group_key} is stored with strides {odd.stride()}, not "
                                  f"as a flat partition; the file is corrupt, {REWRITE}")
        return list(groups)

    def _find_optim_files(self) -> dict[int, Path]:
        found: dict[int, Path] = {}
        for f in self.folder.glob("*_optim_states.pt"):
            m = OPTIM_RE.match(f.name)
            if not m:
                raise CheckpointError(
                    f"{f}: expert (MoE) optimizer files are not supported; only dense ZeRO checkpoints"
                )
            if m.group(3) != "00":
                raise CheckpointError(
                    f"{f}: tensor/pipeline-parallel DeepSpeed checkpoints are not supported (mp_rank {m.group(3)})"
                )
            found[int(m.group(2))] = f
        if not found:
            raise CheckpointError(
                f"no *_optim_states.pt files in {self.folder}; they hold the fp32 weights: "
                "copy them from the run that saved this checkpoint"
            )
        return found

    # -- the CheckpointSource protocol ---------------------------------------------------------
    def params(self) -> list[ParamInfo]:
        """Every state-dict entry in module order: trainable, frozen, buffers, tied aliases."""
        return list(self._infos)

    def load(self, name: str) -> torch.Tensor:
        """The full tensor `name` on the CPU: fp32 for floating tensors; integer buffers keep their dtype."""
        info = self._by_name[name]
        if info.tied_to:
            return self.load(info.tied_to)
        if name not in self.model.trainable:
            return self.model.load_untrained(name, info.shape)
        return self._gather(name, None)

    def load_state(self, name: str, key: str) -> torch.Tensor:
        """Adam's `key` ("exp_avg" or "exp_avg_sq") of trainable parameter `name`, full, fp32, on the CPU: the
        moments lie in each rank's optimizer state exactly as its fp32 partitions do."""
        return self._gather(name, key)

    def check_states(self, keys: tuple[str, ...]) -> None:
        """Every rank's optimizer file holds `keys` for each of its partitions (else one CheckpointError line)."""
        for rank in range(self.world_size):
            for key in keys:
                self._partitions(rank, key)

    def _gather(self, name: str, key: str | None) -> torch.Tensor:
        info = self._by_name[name]
        out = torch.empty(math.prod(info.shape), dtype=torch.float32)
        pos = 0
        for p in self._pieces[name]:
            for lo in range(0, p.numel, _CHUNK):
                n = min(_CHUNK, p.numel - lo)
                self._copy(p.rank, p.start + lo, out[pos : pos + n], key)
                pos += n
        return out.view(info.shape)

    def _partitions(self, rank: int, key: str | None) -> list[torch.Tensor]:
        """Rank `rank`'s fp32 partitions (`key` None) or its Adam `key` of each, in group order."""
        saved = self._meta(self.optim_files[rank])
        groups = saved[self._group_key]  # each rank's checked by _groups when the source was opened
        if key is None:
            return groups
        inner = saved.get("base_optimizer_state" if self.stage < 3 else "optimizer_state_dict")
        state = inner.get("state") if isinstance(inner, dict) else None
        per_group = [state.get(g) if isinstance(state, dict) else None for g in range(len(groups))]
        moments = [s.get(key) if isinstance(s, dict) else None for s in per_group]
        paddings = self._group_paddings(rank, saved, len(groups))
        for g, (m, t) in enumerate(zip(moments, groups)):
            if not isinstance(m, torch.Tensor):
                raise CheckpointError(f"{self.optim_files[rank]} holds no {key} for group {g} (an optimizer other "
                                      "than Adam?); load its weights alone")
            if m.numel() - t.numel() not in (0, paddings[g]):
                raise CheckpointError(
                    f"{self.optim_files[rank]}: {key} of group {g} holds {m.numel()} elements for an fp32 partition "
                    f"of {t.numel()} (padding {paddings[g]}); the file is damaged, copy it again")
        # ZeRO-1/2 save the fp32 partitions without the last rank's alignment padding but Adam's moments with it;
        # the padding is at the end, so the moments' first elements line up with the partition's
        return [m[: t.numel()] for m, t in zip(moments, groups)]

    def _group_paddings(self, rank: int, saved: dict, groups: int) -> list[int]:
        """Per param group, the padding DeepSpeed's ZeRO-1/2 moments carry beyond the fp32 partition (else 0)."""
        paddings = saved.get("group_paddings") if self.stage < 3 else None
        if paddings is None:
            return [0] * groups
        path = self.optim_files[rank]
        if not isinstance(paddings, (list, tuple)) or len(paddings) != groups:
            raise layout.bad_field(path, "group_paddings", paddings, f"a list of {groups} integers")
        return [checked_number(path, f"group_paddings[{g}]", pad, 0, MAX_NUMEL) for g, pad in enumerate(paddings)]

    def loss_scaler(self) -> dict[str, float] | None:
        """The dynamic fp16 loss scaler's counters (DeepSpeed's attribute names) as rank 0 saved them; None for a
        run without one (bf16, fp32, a static scale)."""
        path = self.optim_files[0]
        state = getattr(self._meta(path).get("loss_scaler"), "__dict__", {})
        dynamic = state.get("dynamic")
        if not isinstance(dynamic, (bool, type(None))):
            raise layout.bad_field(path, "loss_scaler.dynamic", dynamic, "true or false")
        if dynamic is not True:
            return None
        top = torch.finfo(torch.float32).max  # the scale is kept in fp32
        ranges = {"cur_scale": (0.0, top), "cur_iter": (0, MAX_NUMEL), "last_overflow_iter": (-1, MAX_NUMEL),
                  "cur_hysteresis": (1, MAX_NUMEL)}  # DeepSpeed starts them at its scale, 0, -1 and hysteresis >= 1
        return {k: checked_number(path, f"loss_scaler.{k}", state.get(k), lo, hi, integer=k != "cur_scale",
                                  above=k == "cur_scale") for k, (lo, hi) in ranges.items()}

    def _copy(self, rank: int, start: int, dst: torch.Tensor, key: str | None = None) -> None:
        """Fill `dst` from rank `rank`'s partitions laid end to end, from `start` (may cross param groups)."""
        path = self.optim_files[rank]
        groups = self._partitions(rank, key)
        pos = 0
        for t in groups:
            n = t.numel()
            if start < n and pos < dst.numel():
                take = min(dst.numel() - pos, n - start)
                self._files.read(path, t, start, dst[pos : pos + take])
                pos += take
            start = max(0, start - n)

    def summary(self) -> SourceSummary:
        """Kind, step, stage, world size, element counts per dtype (tied counted once), bytes on disk."""
        return summarize(
            self.kind,
            self.folder,
            self._infos,
            step=self.model.step,
            stage=self.stage,
            world_size=self.world_size,
            extra={"tag": self.folder.name, "precision": self.precision, "deepspeed_version": self.model.ds_version},
        )

    def verify(self) -> list[str]:
        """CRC-check every rank file (DeepSpeed writes no checksums; torch.save's zip records have CRCs)."""
        return check_zip_files(self.model.paths + self.optim_files)

    def read_problems(self) -> list[str]:
        """CRC failures in the records read so far (checked as they were read), their unread ends finished."""
        return self._files.problems()
