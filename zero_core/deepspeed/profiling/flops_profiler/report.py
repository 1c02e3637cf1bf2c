"""The flops profiler's numbers as text (DeepSpeed's formats: `number_to_string(6144)` is `"6.14 K"`,
`macs_to_string` adds `MACs`, `flops_to_string` `FLOPS`, `duration_to_string` `s`, `params_to_string` writes
billions as `B`), each module's totals, and the printed profile."""

from __future__ import annotations

import contextlib
import os
import sys
from collections import defaultdict
from typing import Any, TextIO

import torch.nn as nn

DEFAULT_PRECISION = 2
_SCALES = {"T": 1e12, "G": 1e9, "M": 1e6, "K": 1e3, "m": 1e-3, "u": 1e-6}


def _auto_unit(num: float) -> str:
    for unit in ("T", "G", "M", "K"):
        if num >= _SCALES[unit]:
            return unit
    if num >= 1 or num == 0:
        return ""
    return "m" if num >= 1e-3 else "u"


def number_to_string(num: float, units: str | None = None, precision: int = DEFAULT_PRECISION) -> str:
    """`num` in the unit given (T, G, M, K, m, u; another: none) or the largest that keeps it >= 1, rounded."""
    unit = _auto_unit(num) if units is None else units
    scaled = num / _SCALES.get(unit, 1)
    return f"{round(scaled, precision):g} {unit}"


def macs_to_string(macs: float, units: str | None = None, precision: int = DEFAULT_PRECISION) -> str:
    return number_to_string(macs, units, precision) + "MACs"


def flops_to_string(flops: float, units: str | None = None, precision: int = DEFAULT_PRECISION) -> str:
    return number_to_string(flops, units, precision) + "FLOPS"


def bytes_to_string(b: float, units: str | None = None, precision: int = DEFAULT_PRECISION) -> str:
    return number_to_string(b, units, precision) + "B"


def duration_to_string(duration: float, units: str | None = None, precision: int = DEFAULT_PRECISION) -> str:
    return number_to_string(duration, units, precision) + "s"


def params_to_string(params_num: float, units: str | None = None, precision: int = DEFAULT_PRECISION) -> str:
    """Parameters: billions written `B` (and asked for as `B`), no trailing space."""
    text = number_to_string(params_num, units.replace("B", "G") if units else units, precision)
    return text.replace("G", "B").strip()


def get_module_flops(module: nn.Module) -> int:
    """The flops of the module's forwards, its submodules' included."""
    return sum(m.__flops__ for m in module.modules())


def get_module_macs(module: nn.Module) -> int:
    return sum(m.__macs__ for m in module.modules())


def get_module_duration(module: nn.Module) -> float:
    """Seconds in the module's forward; a container never called (a ModuleList) sums its children's."""
    if module.__duration__:
        return module.__duration__
    return sum(get_module_duration(m) for m in module.children())


def _params(module: nn.Module) -> int:
    return module.__params__ + module.__expert_params__


def _share(part: float, whole: float) -> float:
    return round(100 * part / whole, DEFAULT_PRECISION) if whole else 0


def _module_line(module: nn.Module, totals: tuple[int, int, float]) -> str:
    params, macs, duration = _params(module), get_module_macs(module), get_module_duration(module)
    flops = get_module_flops(module)
    items = [f"{params_to_string(params)} = {_share(params, totals[0]):g}% Params",
             f"{macs_to_string(macs)} = {_share(macs, totals[1]):g}% MACs",
             f"{duration_to_string(duration)} = {_share(duration, totals[2]):g}% latency",
             flops_to_string(round(flops / duration, DEFAULT_PRECISION) if duration else 0)]
    own = module.extra_repr()
    return ", ".join(items + ([own] if own else []))


def _tree(module: nn.Module, totals: tuple[int, int, float], out: TextIO, name: str = "", indent: str = "") -> None:
    label = f"({name}): " if name else ""
    print(f"{indent}{label}{type(module).__name__}({_module_line(module, totals)})", file=out)
    for child_name, child in module.named_children():
        _tree(child, totals, out, child_name, indent + "  ")


def _by_depth(model: nn.Module) -> dict[int, dict[str, list[float]]]:
    """{depth: {class name: [MACs, params, latency]}} summed over the modules of that class at that depth."""
    info: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0, 0, 0.0]))

    def walk(module: nn.Module, depth: int) -> None:
        row = info[depth][type(module).__name__]
        row[0] += get_module_macs(module)
        row[1] += _params(module)
        row[2] += get_module_duration(module)
        for child in module.children():
            walk(child, depth + 1)

    walk(model, 0)
    return info


def _print_aggregated(model: nn.Module, module_depth: int, top_modules: int, out: TextIO) -> None:
    info = _by_depth(model)
    last = max(info) if module_depth == -1 else min(module_depth, max(info))
    print(f"Top {top_modules} modules by params, MACs and fwd latency at each depth:", file=out)
    for depth in range(last + 1):
        rows = info[depth]

        def top(col: int, fmt: Any) -> dict[str, str]:
            ranked = sorted(rows.items(), key=lambda kv: kv[1][col], reverse=True)[:top_modules]
            return {name: fmt(v[col]) for name, v in ranked}

        print(f"depth {depth}:\n    params      - {top(1, params_to_string)}\n    MACs        - "
              f"{top(0, macs_to_string)}\n    fwd latency - {top(2, duration_to_string)}", file=out)


def _summary(prof: Any, profile_step: int, out: TextIO) -> None:
    flops, macs, params = prof.flops, prof.macs, prof.params
    latency = get_module_duration(prof.model)
    line = "{:<60}  {:<8}"
    print(f"\n---------------- Flops profile (zero_core, torch FlopCounterMode), step {profile_step} ----------------",
          file=out)
    engine = prof.ds_engine
    if engine is not None:
        print(line.format("world size:", engine.world_size), file=out)
        print(line.format("micro-batch size per rank:", engine.train_micro_batch_size_per_gpu()), file=out)
    print(line.format("params per rank:", params_to_string(params)), file=out)
    print(line.format("fwd MACs per rank:", macs_to_string(macs)), file=out)
    print(line.format("fwd flops per rank:", number_to_string(flops)), file=out)
    print(line.format("fwd latency (sum of the model's forwards):", duration_to_string(latency)), file=out)
    print(line.format("fwd FLOPS per rank = fwd flops / fwd latency:",
                      flops_to_string(flops / latency if latency else 0)), file=out)


@contextlib.contextmanager
def _output(output_file: str | None):
    if not output_file:
        yield sys.stdout
        return
    folder = os.path.dirname(os.path.abspath(output_file))
    os.makedirs(folder, exist_ok=True)
    with open(output_file, "w") as f:
        yield f


def print_model_profile(prof: Any, profile_step: int, module_depth: int, top_modules: int, detailed: bool,
                        output_file: str | None) -> None:
    """The profile as FlopsProfiler.print_model_profile prints it (to stdout, or `output_file`, created anew)."""
    with _output(output_file) as out:
        _summary(prof, profile_step, out)
        print("\n---------------- Aggregated profile per rank ----------------", file=out)
        _print_aggregated(prof.model, module_depth, top_modules, out)
        if detailed:
            print("\n---------------- Detailed profile per rank ----------------", file=out)
            print("Each module: params, % of params, MACs, % of MACs, fwd latency, % of latency, fwd FLOPS; a "
                  "module's numbers include its submodules' and the functions its own forward calls.", file=out)
            totals = (prof.params, prof.macs, get_module_duration(prof.model))
            _tree(prof.model, totals, out)
        print("-" * 78, file=out, flush=True)
