"""Shared by the test modules (a helper module, not a test module): repository paths, the one-line error
check, disk snapshots, scenario files, `zbench` in a subprocess and the tables it prints."""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib.util
import io
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import yaml
from click.testing import CliRunner
from forked_cli import run_zbench

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


def repo_pythonpath() -> str:
    """PYTHONPATH for a child Python: this repository first, then what the environment had (a GPU image's
    site folder of carried wheels, say)."""
    return os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
FIXTURES = TESTS / "fixtures"
QUICKSTART = REPO / "scenarios" / "quickstart.yaml"
TINY = str(REPO / "zbench" / "model_configs" / "tiny-gpt.json")  # a str: scenarios hold it as YAML text


# -- commands that fail ------------------------------------------------------------------------------
def fixture_script(name: str):
    """tests/fixtures/<name>.py, the script that recorded a fixture with the real tool, loaded as a module: its cases
    and trace functions are what a test then runs on zbench."""
    spec = importlib.util.spec_from_file_location(name, FIXTURES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def one_line_error(result, alone: bool = False) -> str:
    """The `Error:` line of a command that failed as users should see it: a non-zero exit, no traceback
    anywhere, exactly one line starting with `Error:` and nothing printed after it; with `alone`, nothing
    before it either. `result` is click's test result (its output) or a finished process (its stderr)."""
    if hasattr(result, "exit_code"):
        code, text = result.exit_code, result.output
        assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    else:
        code, text = result.returncode, result.stderr
    lines = text.strip().splitlines()
    assert code != 0, text
    assert "Traceback" not in text, text
    errors = [line for line in lines if line.startswith("Error:")]
    assert len(errors) == 1 and errors[0].startswith("Error: ") and lines[-1] == errors[0], text
    assert not alone or len(lines) == 1, text
    return errors[0]


def cli(*args):
    """`zbench ARGS` in this process (click's test runner); paths may be given as Path."""
    from zbench.cli import main

    return CliRunner().invoke(main, [str(a) for a in args])


def read_command(command: str, folder: Path, out: Path) -> list:
    """`zbench inspect FOLDER`, or `zbench convert FOLDER --to fp32 --out OUT`: the two commands that read a
    checkpoint, for tests that try both on one damaged folder."""
    return [command, folder, *(["--to", "fp32", "--out", out] if command == "convert" else [])]


def refused(box: Path, *args) -> str:
    """`zbench ARGS` must fail with one `Error:` line and leave everything under `box` as it was; that line."""
    before = snapshot(box)
    line = one_line_error(cli(*args))
    assert snapshot(box) == before
    return line


def refused_run(folder: Path, *args) -> str:
    """`zbench run ARGS --out folder/runs --wandb off` must fail with one `Error:` line, all it prints, and launch
    nothing (no run folder appears); that line."""
    out = Path(folder) / "runs"
    line = one_line_error(cli("run", *args, "--out", out, "--wandb", "off"), alone=True)
    assert not out.exists()
    return line


def snapshot(root: Path) -> dict[str, str]:
    """Every entry under `root`: a sha256 per file, "dir" per folder, where each link points (and the sha256 of
    the file it reaches), the kind of anything else (never read: a FIFO would block). Equal snapshots: nothing
    under `root` changed."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(dirpath, name)
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                out[str(path.relative_to(root))] = f"link to {os.readlink(path)}" + (
                    f" ({file_sha256(path)})" if path.is_file() else "")
            elif stat.S_ISDIR(mode):
                out[str(path.relative_to(root))] = "dir"
            elif stat.S_ISREG(mode):
                out[str(path.relative_to(root))] = file_sha256(path)
            else:
                out[str(path.relative_to(root))] = f"special file (mode {mode:o})"
    return out


def rewrite_torch_zip(path: Path, change) -> None:
    """Rewrite every record of the torch.save zip `path` as `change(name, bytes)` says; nothing is unpickled."""
    with zipfile.ZipFile(path) as src:
        records = [(info, src.read(info.filename)) for info in src.infolist()]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as dst:
        for info, data in records:
            dst.writestr(info, change(info.filename, data))
    path.write_bytes(buf.getvalue())


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- scenario files ----------------------------------------------------------------------------------
def scenario_yaml(data: dict) -> str:
    """`data` as the text of a scenario file (libyaml's dumper where present: the battery writes hundreds)."""
    return yaml.dump(data, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), allow_unicode=True)


def write_scenario(folder: Path, data: dict, name: str = "sc") -> str:
    """`data` written as `folder/<name>.yaml`; its path."""
    path = Path(folder) / f"{name}.yaml"
    path.write_text(scenario_yaml(data), encoding="utf-8")
    return str(path)


def _changed(data: dict, changes: dict) -> dict:
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return data


def tiny_data(variants: list[dict], samples: int = 32, **changes) -> dict:
    """A scenario for the tiny GPT on synthetic tokens: 2 ranks, 3 steps of batch 4 at 16 positions, lr 3e-3,
    `samples` training rows; `changes` on top (None drops a key)."""
    data = {"model": {"arch": TINY}, "data": {"synthetic": {"train_samples": samples, "eval_samples": samples // 4}},
            "seq_len": 16, "steps": 3, "batch_size": 4, "gpus": 2, "lr": 3e-3, "variants": copy.deepcopy(variants)}
    return _changed(data, changes)


def tiny_scenario(folder: Path, name: str, variants: list[dict], samples: int = 32, **changes) -> str:
    """tiny_data(...) written as `folder/<name>.yaml`; its path."""
    return write_scenario(folder, tiny_data(variants, samples, **changes), name)


@functools.cache
def _quickstart() -> dict:
    return yaml.safe_load(QUICKSTART.read_text())


def quickstart(**changes) -> dict:
    """The quick-start scenario with the tiny GPT's config named by its path; `changes` on top (None drops a key)."""
    data = copy.deepcopy(_quickstart())
    data["model"] = {"arch": TINY}
    return _changed(data, changes)


# -- zbench in a subprocess --------------------------------------------------------------------------
def zbench(*args: str, env: dict | None = None, timeout: int = 300, faults: str | None = None,
           cwd: Path = REPO):
    """`zbench ARGS` in its own process from `cwd`, by default the repository root (W&B quiet; forked_cli.py),
    or with `faults` injected into its ranks through tests/run_with_faults.py. `timeout` only keeps a hung
    command from hanging the suite."""
    full_env = {**os.environ, "WANDB_SILENT": "true", **(env or {})}
    if not faults:
        return run_zbench(list(args), full_env, str(cwd), timeout)
    return subprocess.run([sys.executable, str(REPO / "tests" / "run_with_faults.py"), faults, *args],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd, env=full_env)


def table(stdout: str) -> dict[str, dict[str, str]]:
    """Rows of a markdown table by variant name (first cell), each by column header: the run's table.md, every
    column, when `stdout` names a run folder (`results: FOLDER`; the terminal shows fewer), else `stdout`'s."""
    named = [line for line in stdout.splitlines() if line.startswith("results: ")]
    text = Path(named[0].split()[1], "table.md").read_text() if named else stdout
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[1:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(header, cells))
    return rows


def printed(stdout: str) -> str:
    """What a command printed with its wrapped lines joined (the terminal table wraps captions and notes)."""
    return " ".join(stdout.split())


def run_dir(stdout: str) -> str:
    """The run folder `zbench run` printed (`results: FOLDER`)."""
    line = next(line for line in stdout.splitlines() if line.startswith("results: "))
    return line.split()[1]


# -- tests that share one spawn ------------------------------------------------------------------------
def selected(request, argname: str) -> list:
    """The values of `argname` among the tests of the requesting module that this run selected, in collection
    order: a module fixture that spawns ranks once runs the cases of these tests only."""
    values = []
    for item in request.session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if item.module is request.module and argname in params and params[argname] not in values:
            values.append(params[argname])
    return values


# -- generated blocks of the docs ----------------------------------------------------------------------
def marked_block(text: str, start: str, end: str) -> str | None:
    """The block of `text` from the `start` marker to the `end` marker inclusive (None when there is none)."""
    lo, hi = text.find(start), text.find(end)
    return text[lo : hi + len(end)] if lo >= 0 and hi > lo else None


def rewrite_block(path: Path, new: str, start: str, end: str) -> None:
    """Replace the marked block of the file at `path` with `new`; exit with a message when it has none."""
    text = path.read_text(encoding="utf-8")
    old = marked_block(text, start, end)
    if old is None:
        sys.exit(f"{path} has no {start} ... {end} block; add one where the table belongs")
    path.write_text(text.replace(old, new), encoding="utf-8")
