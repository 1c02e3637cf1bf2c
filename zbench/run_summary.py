"""What a run folder's files must hold before `zbench report`, `zbench estimate --run` or `--resume` use them.

results.json (the run's summary), variants/<name>.json (one finished row) and floor.json are read back
from a folder the user names, which may be anything: no results.json, a directory of that name, a huge
file, JSON of another shape. Each is checked here (size first, then JSON, then the keys and types the
table, the plots and W&B read), and any problem is one line: "DIR is not a zbench run folder (...)".
Extra keys are allowed (newer versions add some); the caller gets the file's own dict back unchanged.
"""

from __future__ import annotations

import json
import os
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError, model_validator

from zero_core.config_errors import leaf_error, show

from .limits import Flag, count
from .results import TASK_COLUMNS
from .run_folder import run_path
from .scenario import RunName
from .scenario_errors import key_path

MAX_RESULTS_BYTES = 256 << 20  # loss curves of every micro-step: ~100 MiB for 8 variants of a million steps
MAX_ROW_BYTES = 64 << 20



def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise leaf_error("a number", value)
    return value  # NaN as Python's json writes it stands for "not measured" (e.g. GPU memory on the CPU)


Num = Annotated[float, BeforeValidator(_number)]
OptNum = Num | None
Whole = count(0, 2**63 - 1)
BREAKDOWN_KEYS = ("step", "gpu_fwd_bwd", "cpu_adam", "exposed", "h2d_tail", "d2h", "host_fold", "fold_wait", "h2d")


class NotARunFolder(ValueError):
    """One line: the folder and what is wrong with it."""


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class Row(_Open):
    """Every row: who it is and what became of it."""

    variant: RunName
    method: str
    engine: str
    stage: count(0, 3) | None
    status: Literal["ok", "oom", "failed", "unsupported", "remote"]
    note: str


class MeasuredRow(Row):
    """A row that trained: the numbers the table, the plots and W&B show."""

    batch: count(1, 2**63 - 1)
    batch_searched: Flag = False
    batch_search_step: Whole | None = None
    train_oom_batch: count(1, 2**63 - 1) | None = None  # the searched maximum, out of memory over a whole epoch
    train_s_per_epoch: OptNum
    eval_s_per_epoch: OptNum
    eval: dict[str, OptNum]
    eval_per_epoch: list[dict[str, OptNum]] = []
    tokens_per_s: OptNum
    step_ms: OptNum = None
    vs_floor: OptNum = None
    tflops_per_gpu: OptNum
    peak_gpu_gib: OptNum
    peak_cpu_gib: OptNum
    est_gpu_gib: OptNum = None
    losses: list[OptNum]
    parity: OptNum = None  # set with parity_note when the run is summarised (kept rows have neither)
    parity_note: str | None = None
    skipped_steps: Whole | None = None
    breakdown: dict[str, Num] = {}
    compiled: str | None = None

    @model_validator(mode="after")
    def _complete(self) -> "MeasuredRow":
        missing = [k for k in BREAKDOWN_KEYS if self.breakdown and k not in self.breakdown]
        if missing:
            raise ValueError(f"breakdown lacks '{missing[0]}'")
        if self.parity is not None and self.parity_note is None:
            raise ValueError("parity comes without its parity_note")
        return self


class Floor(_Open):
    fwd_bwd_ms: Num
    optimizer_ms: Num
    shard_numel: Num
    batch: count(1, 2**63 - 1)
    compiled: str | None = None


class Summary(_Open):
    scenario: str
    task: Literal[tuple(TASK_COLUMNS)]  # type: ignore[valid-type]
    data_kind: Literal["real", "synthetic"]
    init: str
    model: str
    data_desc: str | None = None
    precision: str
    world_size: count(1, 2**31)
    device: str
    parity_tol: Num
    simulated: Flag = False
    floor: Floor | None = None
    scenario_config: dict[str, Any] | None = None
    variants: list[Row]


def _problem(err: ValidationError, prefix: tuple[Any, ...] = ()) -> str:
    first = err.errors(include_url=False)[0]
    where = key_path(prefix + tuple(first["loc"])) or "the top level"
    if first["type"] == "missing":
        return f"it has no {where}"
    leaf = (first.get("ctx") or {}).get("msg")  # zbench's own checks: "must be ..., got ..."
    if leaf:
        return f"{where} {leaf}"
    return f"{where} is {show(first.get('input'))}: {str(first['msg']).removeprefix('Value error, ')}"


def _read(path: str, limit: int) -> Any:
    """The JSON in `path`; NotARunFolder's reason (without the folder) otherwise."""
    name = os.path.basename(path)
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


def check_row(row: Any, name: str, prefix: tuple[Any, ...] = ()) -> None:
    """A variant's row as the runner writes it; NotARunFolder's reason otherwise."""
    _shaped(row, Row, name, prefix)
    if row["status"] == "ok":
        _shaped(row, MeasuredRow, name, prefix)


def _not_a_run(run_dir: str, reason: str) -> NotARunFolder:
    return NotARunFolder(f"{run_dir} is not a zbench run folder ({reason}); pass a folder written by zbench run")


def load_summary(run_dir: str) -> dict[str, Any]:
    """results.json of `run_dir`, checked; NotARunFolder (one line) if it is not a run's summary."""
    try:
        data = _read(os.path.join(run_dir, "results.json"), MAX_RESULTS_BYTES)
        _shaped(data, Summary, "results.json")
        for i, row in enumerate(data["variants"]):
            check_row(row, "results.json", ("variants", i))
    except NotARunFolder as e:
        raise _not_a_run(run_dir, str(e)) from None
    return data


def load_kept(run_dir: str, path: str, what: Literal["row", "floor"]) -> dict[str, Any]:
    """A kept variants/<name>.json or floor.json of a folder given to --resume, checked."""
    name = os.path.relpath(path, run_dir)
    try:
        data = _read(path, MAX_ROW_BYTES)
        check_row(data, name) if what == "row" else _shaped(data, Floor, name)
    except NotARunFolder as e:
        again = "that variant" if what == "row" else "the floor measurement"
        raise NotARunFolder(f"--resume {run_dir}: {e}; it was not written by zbench run: remove it to run {again} "
                            "again") from None
    return data


def check_resume(run_dir: str, plan: Any) -> None:
    """Before anything runs: a resumed folder comes from the same scenario file (its finished rows are
    reused by name), every file it keeps is one the runner wrote, and no path the run will write
    leaves it (a link planted in the folder)."""
    kept = run_path(run_dir, "scenario.yaml")
    if not os.path.isfile(kept):
        raise NotARunFolder(f"--resume {run_dir} has no scenario.yaml: it is not a zbench run folder; pass a folder "
                            "written by zbench run")
    same = os.path.getsize(kept) == os.path.getsize(plan.path)
    if same:
        with open(kept, "rb") as a, open(plan.path, "rb") as b:
            same = a.read() == b.read()
    if not same:
        raise ValueError(f"--resume {run_dir} was run with another version of the scenario ({kept}); "
                         "resume with that file or start a new run")
    for name in ("results.json", "results.csv", "table.md", "throughput.png", "memory.png", "loss.png", "wandb",
                 "floor.json", "logs/floor"):
        run_path(run_dir, name)
    for vp in plan.variants:
        for part in ("logs", "checkpoints"):
            run_path(run_dir, part, vp.name)
        row = run_path(run_dir, "variants", f"{vp.name}.json")
        if os.path.lexists(row):
            load_kept(run_dir, row, "row")
    if plan.scenario.measure_floor and os.path.lexists(run_path(run_dir, "floor.json")):
        load_kept(run_dir, run_path(run_dir, "floor.json"), "floor")
