"""What a run folder's files must hold before `zbench report`, `zbench estimate --run` or `--resume` use them.

results.json (the run's summary), variants/<name>.json (one finished row) and floor.json are read back
from a folder the user names, which may be anything: no results.json, a directory of that name, a huge
file, JSON of another shape. Each is checked here (size first, then JSON, then the keys and types the
table, the plots and W&B read), and any problem is one line: "DIR is not a zbench run folder (...)".
Extra keys are allowed (newer versions add some); the caller gets the file's own dict back unchanged.
"""

from __future__ import annotations

import json
import math
import os
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, ValidationError, model_validator

from zero_core.config_errors import leaf, leaf_error, show

from .bounds import MAX_GRAD_ACCUM, MAX_NODES, MAX_RANKS
from .limits import Batch, Flag, Positive, Steps, count
from .results import TASK_COLUMNS
from .scenario import Engine, RunName
from .scenario_errors import key_path

MAX_RESULTS_BYTES = 256 << 20  # loss curves of every micro-step: ~100 MiB for 8 variants of a million steps
MAX_ROW_BYTES = 64 << 20


def _number(lo: float | None = None, *, infinite: bool = True) -> Any:
    """A JSON number; NaN, as Python's json writes it, stands for "not measured" (GPU memory on the CPU). With `lo`:
    at least `lo`, and finite unless `infinite`."""
    expected = "a number" if lo is None else f"a{'' if infinite else ' finite'} number >= {lo:g} (or NaN)"

    def check(value: Any) -> float:
        if isinstance(value, float) and math.isnan(value):
            return value
        try:
            number = None if isinstance(value, bool) or not isinstance(value, (int, float)) else float(value)
        except OverflowError:  # an integer past a float's range
            number = None
        if number is None or (lo is not None and (number < lo or not (infinite or math.isfinite(number)))):
            raise leaf_error(expected, value)
        return value

    return Annotated[float, BeforeValidator(check)]


Num = _number()  # losses and metrics: a diverged run's are whatever it computed
OptNum = Num | None
Measure = _number(0, infinite=False)  # times, rates, memory
OptMeasure = Measure | None
Whole = count(0, 2**63 - 1)
World = count(1, MAX_RANKS * MAX_NODES)
BREAKDOWN_KEYS = ("step", "gpu_fwd_bwd", "cpu_adam", "exposed", "h2d_tail", "d2h", "host_fold", "fold_wait", "h2d")


class NotARunFolder(ValueError):
    """One line: the folder and what is wrong with it."""


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class Row(_Open):
    """Every row: who it is and what became of it."""

    variant: RunName
    method: str
    engine: Engine
    stage: count(0, 3) | None
    status: Literal["ok", "oom", "failed", "unsupported", "remote"]
    note: str


class MeasuredRow(Row):
    """A row that trained: every field the table, the CSV, the plots, W&B and loss parity read."""

    batch: Batch
    batch_searched: Flag = False
    batch_search_step: Batch | None = None
    train_oom_batch: Batch | None = None  # the searched maximum, out of memory over a whole epoch
    eval_batch: Batch | None = None
    eval_batch_searched: Flag = False
    world_size: World | None = None
    grad_accum: count(1, MAX_GRAD_ACCUM) | None = None
    device: str | None = None
    data: str | None = None
    train_s_per_epoch: OptMeasure
    eval_s_per_epoch: OptMeasure
    eval: dict[str, OptNum]
    eval_per_epoch: list[dict[str, OptNum]] = []
    tokens_per_s: OptMeasure
    step_ms: OptMeasure = None
    vs_floor: OptMeasure = None
    tflops_per_gpu: OptMeasure
    peak_gpu_gib: OptMeasure
    peak_cpu_gib: OptMeasure
    est_gpu_gib: OptMeasure = None
    losses: list[OptNum]
    parity: _number(0) | None = None  # set with parity_note when the run is summarised (kept rows have neither)
    parity_note: str | None = None
    skipped_steps: Whole | None = None
    skipped_by_step: list[Whole] | None = None  # per optimizer step: the steps skipped so far
    breakdown: dict[str, Num] = {}
    compiled: str | None = None
    simulated: Flag = False
    dropout: Flag = False
    ds_config: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _complete(self) -> "MeasuredRow":
        missing = [k for k in BREAKDOWN_KEYS if self.breakdown and k not in self.breakdown]
        if missing:
            raise ValueError(f"breakdown lacks '{missing[0]}'")
        if self.parity is not None and self.parity_note is None:
            raise ValueError("parity comes without its parity_note")
        return self


class KeptRow(MeasuredRow):
    """A finished row --resume keeps: compared again with the ddp row, loss by loss (the runner writes NaN, never
    null, for a loss that was not finite)."""

    losses: list[Num]


class Floor(_Open):
    fwd_bwd_ms: Measure
    optimizer_ms: Measure
    shard_numel: Measure
    batch: Batch
    compiled: str | None = None


class ScenarioConfig(_Open):
    """The scenario as the run read it: the caption reads this much of it."""

    timing_skip_steps: Steps = 0


def _named_once(rows: list[Row]) -> list[Row]:
    if not rows:
        raise leaf("lists no row; a run has at least one variant")
    names = [r.variant for r in rows]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice is not None:
        raise leaf(f"hold two rows of variant '{twice}'; a run has one row per variant")
    return rows


class Summary(_Open):
    scenario: RunName
    task: Literal[tuple(TASK_COLUMNS)]  # type: ignore[valid-type]
    data_kind: Literal["real", "synthetic"]
    init: Literal["random-init", "pretrained"]
    model: str
    data_desc: str | None = None
    precision: Literal["fp32", "bf16", "fp16"]
    world_size: World
    device: str
    parity_tol: Positive
    simulated: Flag = False
    floor: Floor | None = None
    scenario_config: ScenarioConfig | None = None
    variants: Annotated[list[Row], AfterValidator(_named_once)]


def _problem(err: ValidationError, prefix: tuple[Any, ...] = ()) -> str:
    first = err.errors(include_url=False)[0]
    where = key_path(prefix + tuple(first["loc"])) or "the top level"
    if first["type"] == "missing":
        return f"it has no {where}"
    leaf = (first.get("ctx") or {}).get("msg")  # zbench's own checks: "must be ..., got ..."
    if leaf:
        return f"{where} {leaf}"
    return f"{where} is {show(first.get('input'))}: {str(first['msg']).removeprefix('Value error, ')}"


def _read(path: str, limit: int, name: str) -> Any:
    """The JSON in `path` (`name`: how messages call it); NotARunFolder's reason (without the folder) otherwise."""
    if not os.path.lexists(path):
        raise NotARunFolder(f"no {name}")
    if os.path.islink(path) or not os.path.isfile(path):
        raise NotARunFolder(f"{name} is not a regular file")
    size = os.path.getsize(path)
    if size > limit:
        raise NotARunFolder(f"{name} is {size / 2**20:,.0f} MiB, more than the {limit >> 20} MiB a zbench file holds")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError, RecursionError) as e:
        raise NotARunFolder(f"{name} cannot be read ({getattr(e, 'strerror', None) or type(e).__name__})") from None
    except json.JSONDecodeError as e:
        raise NotARunFolder(f"{name} is not valid JSON: {e.msg} at line {e.lineno}") from None


def _shaped(data: Any, model: type[BaseModel], name: str, prefix: tuple[Any, ...] = ()) -> None:
    if not isinstance(data, dict):
        raise NotARunFolder(f"{name} holds a JSON {type(data).__name__}, not an object")
    try:
        model.model_validate(data)
    except ValidationError as err:
        raise NotARunFolder(f"{name}: {_problem(err, prefix)}") from None


def check_row(row: Any, name: str, prefix: tuple[Any, ...] = (), kept: bool = False) -> None:
    """A variant's row as the runner writes it (`kept`: as it writes variants/<name>.json); NotARunFolder's reason
    otherwise."""
    _shaped(row, Row, name, prefix)
    if row["status"] == "ok":
        _shaped(row, KeptRow if kept else MeasuredRow, name, prefix)


def _not_a_run(run_dir: str, reason: str) -> NotARunFolder:
    return NotARunFolder(f"{run_dir} is not a zbench run folder ({reason}); pass a folder written by zbench run")


def load_summary(run_dir: str) -> dict[str, Any]:
    """results.json of `run_dir`, checked; NotARunFolder (one line) if it is not a run's summary."""
    try:
        data = _read(os.path.join(run_dir, "results.json"), MAX_RESULTS_BYTES, "results.json")
        _shaped(data, Summary, "results.json")
        for i, row in enumerate(data["variants"]):
            check_row(row, "results.json", ("variants", i))
    except NotARunFolder as e:
        raise _not_a_run(run_dir, str(e)) from None
    return data


def load_kept(run_dir: str, path: str, what: Literal["row", "floor"]) -> dict[str, Any]:
    """A kept variants/<name>.json (the row of variant <name>) or floor.json of a folder given to --resume, checked."""
    name = os.path.relpath(path, run_dir)
    again = os.path.basename(path).removesuffix(".json") if what == "row" else "the floor measurement"
    try:
        data = _read(path, MAX_ROW_BYTES, name)
        check_row(data, name, kept=True) if what == "row" else _shaped(data, Floor, name)
    except NotARunFolder as e:
        raise NotARunFolder(f"--resume {run_dir}: {e}; it was not written by zbench run: remove it to run {again} "
                            "again") from None
    if what == "row" and f"{data['variant']}.json" != os.path.basename(path):  # a copy of another variant's row
        raise NotARunFolder(f"--resume {run_dir}: {name} holds the row of '{data['variant']}'; remove it to run "
                            f"{again} again")
    return data
