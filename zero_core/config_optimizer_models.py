"""The optimizer and LR-scheduler sections of the config: DeepSpeed's "optimizer" and "scheduler" keys.

Defaults are DeepSpeed's (deepspeed/runtime/config.py, lr_schedules.py) unless a comment says otherwise.
Adam/AdamW take `AdamParams`; every other type (config_optimizer_types.py) takes its constructor's keyword
arguments, kept as given (`arguments`), while `params` then holds the lr and weight_decay they resolve to.
One `SchedulerParams` holds every scheduler's parameters; `SCHEDULER_KEYS` says which apply to each type,
and a scheduler section serializes only its own type's.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import PlainValidator, PrivateAttr, model_serializer, model_validator

from .config_errors import ConfigError, leaf_error
from .config_keys import SCHEDULER_KEYS
from .config_optimizer_types import canonical_type, checked_arguments, other_type
from .config_types import AS_LIST, Bool, OptionalBool, Section, as_bool, beta_pair, choice, integer, number


class AdamParams(Section):
    lr: Annotated[float, number(0.0)] = 1e-3
    betas: Annotated[tuple[float, float], beta_pair(), AS_LIST] = (0.9, 0.999)
    eps: Annotated[float, number(0.0, lo_open=True)] = 1e-8
    weight_decay: Annotated[float, number(0.0)] = 0.0
    adam_w_mode: Bool = True  # DeepSpeed's ADAM_W_MODE_DEFAULT: type "Adam" means AdamW unless set false
    torch_adam: Bool = False  # accepted for compatibility; zero_core always uses its own fused kernel
    # the other arguments DeepSpeed passes on to FusedAdam, DeepSpeedCPUAdam or torch's Adam(W); zero_core's fused
    # kernels implement the defaults only (config_keys_deepspeed.py)
    amsgrad: Bool = False
    bias_correction: Bool = True
    maximize: Bool = False
    fp32_optimizer_states: OptionalBool = None  # DeepSpeed: none means true
    fused: OptionalBool = None
    foreach: OptionalBool = None
    capturable: Bool = False
    differentiable: Bool = False
    set_grad_none: Bool = True


class OptimizerConfig(Section):
    type: Annotated[str, PlainValidator(canonical_type)]
    params: AdamParams = AdamParams()
    legacy_fusion: Bool = False
    _arguments: dict[str, Any] | None = PrivateAttr(default=None)  # another type's params section, as given

    @model_validator(mode="wrap")
    @classmethod
    def _other_types(cls, data: Any, handler: Any) -> Any:
        """A type other than Adam/AdamW: its params checked against its constructor and kept as its arguments;
        `params` holds the lr and weight_decay they resolve to (what the groups and the lr schedules read)."""
        kind = other_type(data)
        raw = data.get("params", {}) if kind is not None else None
        if not isinstance(raw, dict):
            return handler(data)
        arguments, common = checked_arguments(kind, raw)
        made = handler({**data, "type": kind, "params": common})
        made._arguments = arguments
        return made

    @model_serializer(mode="wrap")
    def _own_arguments(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        if self._arguments is not None:
            data["params"] = dict(self._arguments)  # DeepSpeed's form: what is read back is this same section
        return data

    @property
    def arguments(self) -> dict[str, Any] | None:
        """The keyword arguments of a type other than Adam/AdamW (None for those two)."""
        return None if self._arguments is None else dict(self._arguments)

    @model_validator(mode="before")
    @classmethod
    def _torch_adamw_weight_decay(cls, data: Any) -> Any:
        # With torch_adam DeepSpeed builds torch.optim.AdamW, whose default weight_decay is 0.01.
        params = data.get("params") if isinstance(data, dict) else None
        adam = isinstance(data, dict) and str(data.get("type", "")).strip().lower() in ("adam", "adamw")
        if adam and isinstance(params, dict) and "weight_decay" not in params and as_bool(params.get("torch_adam")):
            decoupled = str(data.get("type", "")).lower() == "adamw" or as_bool(params.get("adam_w_mode", True))
            if decoupled:
                data = {**data, "params": {**params, "weight_decay": 0.01}}
        return data

    @property
    def decoupled(self) -> bool:
        """AdamW-style decoupled weight decay (DeepSpeed: type AdamW, or Adam with adam_w_mode)."""
        return self.type == "AdamW" or self.params.adam_w_mode


def _lr_or_lrs(value: Any) -> float | list[float]:
    """An lr >= 0, or a non-empty list of them (one per optimizer group, as DeepSpeed's LRRangeTest takes it)."""
    def is_lr(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0

    if is_lr(value):
        return float(value)
    if isinstance(value, list) and value and all(is_lr(v) for v in value):
        return [float(v) for v in value]
    raise leaf_error("a finite number >= 0 or a list of them, one per optimizer group", value)


class SchedulerParams(Section):
    """Every DeepSpeed scheduler's parameters in one section; which apply depends on `type` (SCHEDULER_KEYS)."""

    warmup_min_lr: Annotated[float, number(0.0)] = 0.0
    warmup_max_lr: Annotated[float | None, number(0.0, optional=True)] = None  # WarmupLR: the groups' lrs; DecayLR 1e-3
    warmup_num_steps: Annotated[int, integer(1, counts=True)] = 1000  # DeepSpeed refuses 0 (a ValueError)
    warmup_type: Annotated[str, choice({"log": "log", "linear": "linear"})] = "log"
    total_num_steps: Annotated[int | None, integer(1, counts=True, optional=True)] = None
    last_batch_iteration: Annotated[int, integer(-1)] = -1
    warmup_min_ratio: Annotated[float, number(0.0, 1.0)] = 0.0  # WarmupCosineLR
    cos_min_ratio: Annotated[float, number(0.0, 1.0)] = 0.0001
    cycle_min_lr: Annotated[float | None, number(0.0, optional=True)] = None  # OneCycle
    cycle_max_lr: Annotated[float | None, number(0.0, optional=True)] = None
    decay_lr_rate: Annotated[float, number(0.0)] = 0.0
    cycle_first_step_size: Annotated[int, integer(1, counts=True)] = 2000
    cycle_second_step_size: Annotated[int | None, integer(0, counts=True, optional=True)] = None
    cycle_first_stair_count: Annotated[int, integer(0)] = 0
    cycle_second_stair_count: Annotated[int | None, integer(0, optional=True)] = None
    decay_step_size: Annotated[int, integer(0, counts=True)] = 0
    cycle_momentum: Bool = True
    cycle_min_mom: Annotated[float, number(0.0, 1.0, hi_open=True)] = 0.8
    cycle_max_mom: Annotated[float, number(0.0, 1.0, hi_open=True)] = 0.9
    decay_mom_rate: Annotated[float, number(0.0)] = 0.0
    # LRRangeTest: the lr grows from min_lr (one per group, or one for all) by step_rate per step_size iterations
    lr_range_test_min_lr: Annotated[float | list[float], PlainValidator(_lr_or_lrs)] = 1e-3
    lr_range_test_step_size: Annotated[int, integer(1)] = 2000  # DeepSpeed: a positive int, not 2e3
    lr_range_test_step_rate: Annotated[float, number(0.0)] = 1.0
    lr_range_test_staircase: Bool = False


# the scheduler parameters DeepSpeed's classes also take as a list, one value per optimizer param group
PER_GROUP_KEYS = {"WarmupLR": ("warmup_min_lr", "warmup_max_lr"), "WarmupDecayLR": ("warmup_min_lr", "warmup_max_lr"),
                  "OneCycle": ("cycle_min_lr", "cycle_max_lr", "cycle_min_mom", "cycle_max_mom")}


class SchedulerConfig(Section):
    """`params` holds one value per key; where a PER_GROUP_KEYS parameter was given as a list, its first value, and
    `per_group` the whole lists (each value checked as a single one would be), which `for_groups` splits."""

    type: Annotated[str, choice({k.lower(): k for k in SCHEDULER_KEYS}, note="(the schedulers zero_core implements)")]
    params: SchedulerParams = SchedulerParams()
    _per_group: dict[str, list[float]] | None = PrivateAttr(default=None)

    @model_validator(mode="wrap")
    @classmethod
    def _lists(cls, data: Any, handler: Any) -> Any:
        params = data.get("params") if isinstance(data, dict) else None
        kind = str(data.get("type")).lower() if isinstance(data, dict) else None
        kind = next((k for k in PER_GROUP_KEYS if k.lower() == kind), None)
        lists = {k: v for k, v in params.items() if k in PER_GROUP_KEYS.get(kind, ()) and isinstance(v, list) and v} \
            if isinstance(params, dict) else {}  # an empty list is left to the number check, which refuses it
        if not lists:
            return handler(data)
        firsts = {k: v[0] for k, v in lists.items()}
        checked: dict[str, list[float]] = {k: [] for k in lists}
        for key, values in lists.items():  # each value checked where a single number would be
            for value in values:
                one = handler({**data, "params": {**params, **firsts, key: value}})
                checked[key].append(getattr(one.params, key))
        made = handler({**data, "params": {**params, **firsts}})
        made._per_group = checked
        return made

    @model_serializer(mode="wrap")
    def _only_this_types_params(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        data["params"] = {k: v for k, v in data["params"].items() if k in SCHEDULER_KEYS[self.type]}
        data["params"].update({k: list(v) for k, v in (self._per_group or {}).items()})  # as given: the lists
        return data

    @property
    def per_group(self) -> dict[str, list[float]]:
        """The parameters given as lists, one value per param group (empty where none was)."""
        return {k: list(v) for k, v in (self._per_group or {}).items()}

    def for_groups(self, groups: int) -> list["SchedulerConfig"]:
        """One section per param group, each holding that group's values of the lists (all equal without lists);
        a list of another length is a ConfigError naming the fix."""
        for key, values in self.per_group.items():
            if len(values) != groups:
                raise ConfigError(f"scheduler.params.{key} has {len(values)} values but the optimizer has {groups} "
                                  "param groups; give one value per group, or a single number for all")
        if not self._per_group:
            return [self] * groups
        out = []
        for i in range(groups):
            one = self.model_copy(update={"params": self.params.model_copy(
                update={k: v[i] for k, v in self._per_group.items()})})
            one._per_group = None
            out.append(one)
        return out
