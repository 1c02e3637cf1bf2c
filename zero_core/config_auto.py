""""auto" in a DeepSpeed config, filled the way Hugging Face's Trainer fills it. The only module that knows "auto".

    filled_config, filled = fill_auto(raw, AutoValues(learning_rate=3e-5, per_device_train_batch_size=8, ...))

HF's two rules (transformers/integrations/deepspeed.py, HfTrainerDeepSpeedConfig): `fill_match` replaces
"auto" with the caller's value, and an explicit config value that differs from it is a mismatch;
`fill_only` replaces "auto" and never compares. A key that is absent stays absent. `AUTO_RULES` lists
every key, where its value comes from and what "auto" means when the caller does not know that value:
DeepSpeed's or HF's fixed default where one exists, DeepSpeed's batch arithmetic for the batch sizes,
otherwise a problem naming what is missing. Every problem is collected; none stops the others.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from .config_auto_values import AutoValues
from .config_errors import ConfigError, Problem, combined


def is_auto(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() == "auto"


class Derive(NamedTuple):
    """Without a value, "auto" is treated as absent and DeepSpeed's batch arithmetic derives the key."""


class Needs(NamedTuple):
    """Without a value, "auto" is a problem; `fix` says what to write instead."""

    fix: str


@dataclass(frozen=True)
class AutoRule:
    key: str  # dotted DeepSpeed key
    fields: tuple[str, ...]  # the AutoValues fields it is filled from
    match: bool  # HF's fill_match (an explicit value must agree) or fill_only
    value: Callable[[AutoValues, dict], Any]  # the filled value, None when the values lack it
    fallback: Any  # without a value: a fixed value, a function of the config, Derive() or Needs(fix)
    rule: str  # HF's rule, for the docs
    without: str  # what "auto" means without a value, for the docs
    shown: str = ""  # how messages name the fields (default: their names)


def _batch(v: AutoValues, raw: dict) -> int | None:
    """world * micro * gas, each from the values or else a number in the config (after filling; no
    gradient_accumulation_steps is 1, as DeepSpeed derives it)."""
    micro = v.per_device_train_batch_size or _number(raw.get("train_micro_batch_size_per_gpu"))
    gas = v.gradient_accumulation_steps or _number(raw.get("gradient_accumulation_steps", 1))
    return v.world_size * micro * gas if v.world_size and micro and gas else None


def _number(value: Any) -> Any:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _betas(v: AutoValues, raw: dict) -> list[float] | None:
    if v.adam_beta1 is None and v.adam_beta2 is None:
        return None
    return [0.9 if v.adam_beta1 is None else v.adam_beta1, 0.999 if v.adam_beta2 is None else v.adam_beta2]


def _precision(name: str) -> Callable[[AutoValues, dict], bool | None]:
    return lambda v, raw: None if v.fp16 is None and v.bf16 is None else bool(getattr(v, name))


def _stage3(raw: dict) -> bool:
    zero = raw.get("zero_optimization")
    return isinstance(zero, dict) and _number(zero.get("stage")) == 3


def _optimizer_lr(raw: dict) -> Any:
    """warmup_max_lr without a learning rate: the optimizer's lr (zero_core's default 1e-3 without one)."""
    opt = raw.get("optimizer", {})
    params = opt.get("params", {}) if isinstance(opt, dict) else None
    lr = params.get("lr", 1e-3) if isinstance(params, dict) else None
    if isinstance(lr, bool) or not isinstance(lr, (int, float)):
        return Needs("set a number, or a numeric optimizer.params.lr")
    return lr


_STEPS = "set a number of optimizer steps"
_HIDDEN = "DeepSpeed's default ({d:,})"
_MATCH, _ONLY = "fill_match", "fill_only"


def _rules() -> list[AutoRule]:
    from .config_models import AioConfig, OffloadParamConfig, ZeroOptimizationConfig

    def default(model: Any, name: str) -> int:
        return model.model_fields[name].default

    zero = "zero_optimization."
    rules = [
        AutoRule("train_micro_batch_size_per_gpu", ("per_device_train_batch_size",), True,
                 lambda v, raw: v.per_device_train_batch_size, Derive(), _MATCH, "derived from the other two"),
        AutoRule("gradient_accumulation_steps", ("gradient_accumulation_steps",), True,
                 lambda v, raw: v.gradient_accumulation_steps, Derive(), _MATCH, "derived from the other two"),
        AutoRule("train_batch_size", ("world_size", "per_device_train_batch_size", "gradient_accumulation_steps"), True,
                 _batch, Derive(), f"{_MATCH} (world * micro * gas)", "derived: world * micro * gas",
                 "world_size * per_device_train_batch_size * gradient_accumulation_steps"),
        AutoRule("gradient_clipping", ("max_grad_norm",), True, lambda v, raw: v.max_grad_norm, 1.0, _MATCH,
                 "1.0 (HF's max_grad_norm default)"),
        AutoRule("optimizer.params.lr", ("learning_rate",), True, lambda v, raw: v.learning_rate,
                 Needs("set a number such as 1e-4"), _MATCH, "an error"),
        AutoRule("optimizer.params.betas", ("adam_beta1", "adam_beta2"), True, _betas, [0.9, 0.999], _MATCH,
                 "[0.9, 0.999] (HF's defaults)", "adam_beta1/adam_beta2"),
        AutoRule("optimizer.params.eps", ("adam_epsilon",), True, lambda v, raw: v.adam_epsilon, 1e-8, _MATCH,
                 "1e-8 (HF's default)"),
        AutoRule("optimizer.params.weight_decay", ("weight_decay",), True, lambda v, raw: v.weight_decay, 0.0, _MATCH,
                 "0.0 (HF's default)"),
        AutoRule("scheduler.params.warmup_min_lr", (), False, lambda v, raw: 0.0, 0.0, f"{_ONLY} (0)", "0"),
        AutoRule("scheduler.params.warmup_max_lr", ("learning_rate",), True, lambda v, raw: v.learning_rate,
                 _optimizer_lr, _MATCH, "optimizer.params.lr when it is a number"),
        AutoRule("scheduler.params.total_num_steps", ("max_steps",), True, lambda v, raw: v.max_steps,
                 Needs(_STEPS), _MATCH, "an error"),
        AutoRule("scheduler.params.warmup_num_steps", ("warmup_steps",), True,
                 lambda v, raw: None if v.warmup_steps is None else max(1, v.warmup_steps), Needs(_STEPS),
                 f"{_MATCH} (max(1, warmup): DeepSpeed >= 0.19.6 rejects 0)", "an error"),
        AutoRule("fp16.enabled", ("fp16", "bf16"), True, _precision("fp16"), Needs("set true or false"), _MATCH,
                 "an error", "fp16/bf16"),
        AutoRule("bf16.enabled", ("fp16", "bf16"), True, _precision("bf16"), Needs("set true or false"), _MATCH,
                 "an error", "fp16/bf16"),
        AutoRule(zero + "reduce_bucket_size", ("hidden_size",), False,
                 lambda v, raw: v.hidden_size and v.hidden_size * v.hidden_size,
                 default(ZeroOptimizationConfig, "reduce_bucket_size"), f"{_ONLY} (h * h)",
                 _HIDDEN.format(d=default(ZeroOptimizationConfig, "reduce_bucket_size"))),
        AutoRule(zero + "stage3_prefetch_bucket_size", ("hidden_size",), False,
                 lambda v, raw: v.hidden_size and _stage3(raw) and int(0.9 * v.hidden_size * v.hidden_size) or None,
                 default(ZeroOptimizationConfig, "stage3_prefetch_bucket_size"),
                 f"{_ONLY} at stage 3 (int(0.9 * h * h))",
                 _HIDDEN.format(d=default(ZeroOptimizationConfig, "stage3_prefetch_bucket_size"))
                 + ", also below stage 3"),
        AutoRule(zero + "stage3_param_persistence_threshold", ("hidden_size",), False,
                 lambda v, raw: v.hidden_size and _stage3(raw) and 10 * v.hidden_size or None,
                 default(ZeroOptimizationConfig, "stage3_param_persistence_threshold"), f"{_ONLY} at stage 3 (10 * h)",
                 _HIDDEN.format(d=default(ZeroOptimizationConfig, "stage3_param_persistence_threshold"))
                 + ", also below stage 3"),
    ]
    # element counts HF never fills: "auto" is DeepSpeed's default, as before
    counts = [(zero, ZeroOptimizationConfig, n) for n in ("allgather_bucket_size", "stage3_max_live_parameters",
                                                          "stage3_max_reuse_distance", "sub_group_size")]
    counts += [(zero + "offload_param.", OffloadParamConfig, n) for n in ("buffer_size", "max_in_cpu")]
    counts += [("aio.", AioConfig, "block_size")]
    for prefix, model, name in counts:
        d = default(model, name)
        rules.append(AutoRule(prefix + name, (), False, lambda v, raw: None, d, "not filled by HF",
                              _HIDDEN.format(d=d)))
    return rules


AUTO_RULES = _rules()


class Resolution(NamedTuple):
    config: Any  # the config with every resolvable "auto" filled (a copy); unresolved ones stay "auto"
    filled: list[tuple[str, Any, tuple[str, ...]]]  # (dotted key, value, the fields it came from; () = a default)
    problems: list[Problem]


def resolve_auto(raw: Any, values: AutoValues | Mapping[str, Any] | None = None, *,
                 defaults: AutoValues | Mapping[str, Any] | None = None,
                 labels: Mapping[str, str] | None = None) -> Resolution:
    """Fill every "auto" of `raw`; problems (mismatches, values nobody gave) are returned, not raised.

    `values` follow HF's fill_match; `defaults` only fill an "auto" that `values` leave open and are never
    compared with explicit config values (a command line's default flags). `labels` name a field in
    messages (e.g. {"learning_rate": "--lr"})."""
    told, fallback = AutoValues.of(values), AutoValues.of(defaults)
    merged = AutoValues(**{f.name: getattr(told, f.name) if told.known(f.name) else getattr(fallback, f.name)
                           for f in dataclasses.fields(AutoValues)})
    labels = labels or {}
    if not isinstance(raw, dict):
        return Resolution(raw, [], [])
    out, filled, problems, derived = copy.deepcopy(raw), [], [], []
    for rule in AUTO_RULES:
        section, name = _node(out, rule.key)
        if section is None or name not in section:
            continue
        if not is_auto(section[name]):
            given = rule.value(told, out)
            if rule.match and given is not None and _differs(section[name], given) and _compared(rule, told):
                problems.append(_mismatch(rule, section[name], given, labels))
            continue
        value = rule.value(merged, out)
        source = tuple(f for f in rule.fields if merged.known(f))
        if value is None:
            value = rule.fallback(raw) if callable(rule.fallback) else rule.fallback  # the config as given
            source = ()
        if isinstance(value, (Derive, Needs)):
            del section[name]  # derived from the other batch sizes, or reported as a problem
            derived += [rule] if isinstance(value, Derive) else []
        if isinstance(value, Needs):
            problems.append(Problem((rule.key,), _needs(rule, value.fix, labels)))
        elif not isinstance(value, Derive):
            section[name] = value
            filled.append((rule.key, value, source))
    if derived and "train_batch_size" not in out and "train_micro_batch_size_per_gpu" not in out:
        # nothing to derive from
        problems.append(Problem((derived[0].key,), _needs(derived[0], "set a number", labels)))
    return Resolution(out, filled, problems)


def _compared(rule: AutoRule, told: AutoValues) -> bool:
    """train_batch_size is compared when the caller gave its factors; else DeepSpeed's arithmetic checks it."""
    return rule.key != "train_batch_size" or told.known(*rule.fields[1:])


def fill_auto(raw: Any, values: AutoValues | Mapping[str, Any] | None = None, *,
              defaults: AutoValues | Mapping[str, Any] | None = None,
              labels: Mapping[str, str] | None = None) -> tuple[Any, list[tuple[str, Any]]]:
    """(the config with every "auto" filled, [(dotted key, value) filled]); one ConfigError lists every problem."""
    res = resolve_auto(raw, values, defaults=defaults, labels=labels)
    if res.problems:
        raise ConfigError(combined([p.message for p in res.problems]))
    return res.config, [(key, value) for key, value, _ in res.filled]


def _node(data: dict, dotted: str) -> tuple[dict | None, str]:
    *path, name = dotted.split(".")
    for part in path:
        data = data.get(part) if isinstance(data, dict) else None
    return (data if isinstance(data, dict) else None), name


def _comparable(value: Any) -> Any:
    """A config value as zero_core reads it ("true" is true, 2e8 is 200000000), or None if it is no valid value."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    numbers = value if isinstance(value, (list, tuple)) else [value]
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in numbers):
        return None
    try:
        floats = tuple(float(x) for x in numbers)
    except OverflowError:  # an int beyond float range: the field check names it
        return None
    return floats if isinstance(value, (list, tuple)) else floats[0]


def _differs(config_value: Any, value: Any) -> bool:
    mine = _comparable(config_value)
    return mine is not None and mine != _comparable(value)


def _source(rule: AutoRule, labels: Mapping[str, str]) -> str:
    if not any(f in labels for f in rule.fields):
        return rule.shown or "/".join(rule.fields)
    named = list(dict.fromkeys(labels.get(f, f) for f in rule.fields))
    return (" * " if rule.key == "train_batch_size" else "/").join(named)


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(list(value)) if isinstance(value, (list, tuple)) else str(value)


def _mismatch(rule: AutoRule, config_value: Any, value: Any, labels: Mapping[str, str]) -> Problem:
    source = _source(rule, labels) if any(f in labels for f in rule.fields) else f"the caller's {_source(rule, labels)}"
    return Problem((rule.key,), f"{rule.key} is {_shown(config_value)} in the config but {source} gives "
                                f"{_shown(value)}; make them agree or set {rule.key} to \"auto\"")


def _needs(rule: AutoRule, fix: str, labels: Mapping[str, str]) -> str:
    if any(f in labels for f in rule.fields):
        return f"{rule.key} cannot be 'auto' without {_source(rule, labels)}; pass it, or {fix}"
    example = ", ".join(f'"{f}": ...' for f in rule.fields)
    return f"{rule.key} cannot be 'auto' without {_source(rule, labels)} (auto={{{example}}}); {fix}"
