"""The 18 DeepSpeed configs of the seed articles, verbatim (tests/data/seed_configs/SOURCES.md), each run by
`zbench train --config FILE` on 2 CPU ranks with the flags that fill its "auto" values.

Snippets that are fragments get what they lack (a batch size) from flags too, never by editing the file.
The ZeRO-Infinity example puts its "aio" section inside zero_optimization, which DeepSpeed 0.19.8 refuses: its
one-line error is asserted instead.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import zbench
from zero_core.config_keys import BY_PATH, SUPPORTED

pytestmark = pytest.mark.slow  # spawned ranks or whole runs: outside the fast tier (-m 'not slow')

REPO = Path(__file__).resolve().parent.parent
SEEDS = REPO / "tests" / "data" / "seed_configs"
COMMON = ["--gpus", "2", "--steps", "2", "--seq-len", "8"]
MB = ["--micro-batch", "2"]
HF_TRAINER = ["--lr", "1e-3", *MB, "--grad-accum", "1"]
RUNS = {  # the flags that fill each config's "auto" values
    "000_zero2_config_accelerate.json": [*HF_TRAINER, "--precision", "fp16"],
    "000_zero3_offload_config_accelerate.json": [*HF_TRAINER, "--precision", "fp16"],
    "001_kaggle_longformer_ds_config_dict.json": [*HF_TRAINER, "--precision", "bf16"],
    "003_zero3_infinity_nvme.json": [*HF_TRAINER, "--precision", "bf16"],
    "003_ds_config_zero3_notebook.json": [*HF_TRAINER, "--precision", "fp16"],
    "003_zero1.json": MB,
    "003_batch_size.json": MB,
    "003_communication_data_type.json": [*MB, "--precision", "bf16"],
    "003_gradient_accumulation.json": [*MB, "--grad-accum", "2"],
    "003_gradient_clipping.json": MB,
    "003_fp16_disabled.json": MB,
    "003_optimizer_auto.json": [*MB, "--lr", "1e-3"],
    "003_zero_allow_untested_optimizer.json": MB,
    "003_zero_force_ds_cpu_optimizer.json": MB,
    "003_load_universal.json": MB,
    "003_use_node_local_storage.json": MB,
    "003_stage3_gather_16bit_weights.json": MB,
    "003_fp16_auto_nan_section.json": [*MB, "--precision", "fp16"],
}
NVME = (
    "Error: key 'zero_optimization.aio' is not supported by zero_core; move the 'aio' section to the top level of "
    "the config, where DeepSpeed reads it (DeepSpeed refuses it inside zero_optimization too)"
)  # the seed's aio section sits where DeepSpeed's zero_optimization model refuses it


def _leaves(data: object, prefix: str = "") -> dict[str, object]:
    if not isinstance(data, dict):
        return {prefix[:-1]: data}
    out: dict[str, object] = {}
    for key, value in data.items():
        out |= (
            _leaves(value, f"{prefix}{key}.")
            if isinstance(value, dict) and f"{prefix}{key}" not in BY_PATH
            else {prefix + key: value}
        )
    return out


def test_the_18_configs_are_all_here_and_sourced():
    files = sorted(p.name for p in SEEDS.glob("*.json"))
    assert files == sorted(RUNS) and len(files) == 18
    sources = (SEEDS / "SOURCES.md").read_text()
    assert all(f"| {name} |" in sources for name in files)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_zbench_train_runs_the_config_as_printed(name):
    raw = json.loads((SEEDS / name).read_text())
    env = {"ZBENCH_START_METHOD": "fork"}  # the CLI runs no torch op first
    proc = zbench("train", "--config", str(SEEDS / name), *COMMON, *RUNS[name], env=env)
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out, out[-3000:]
    if name == "003_zero3_infinity_nvme.json":
        assert proc.returncode != 0 and NVME in out
        return
    assert proc.returncode == 0, out[-3000:]
    done = [line for line in proc.stdout.splitlines() if line.startswith("done:")]
    assert len(done) == 1 and " on 2 ranks, 2 timed steps" in done[0]
    filled = {
        entry.split(" = ")[0]
        for line in proc.stdout.splitlines()
        if line.startswith("filled ")
        for entry in line.split(": ", 1)[1].split(", ")
        if " = " in entry
    }
    autos = {key for key, value in _leaves(raw).items() if value == "auto"}
    assert autos <= filled, f"not filled from flags: {autos - filled}"
    quiet = [key for key in _leaves(raw) if key in BY_PATH and BY_PATH[key].status != SUPPORTED]
    prefix = "zero_core: accepted, not acted on: "
    named = [line.removeprefix(prefix) for line in out.splitlines() if line.startswith(prefix)]
    assert len(named) == (1 if quiet else 0)  # rank 0 only, once
    if quiet:
        assert sorted(entry.split(" (")[0] for entry in named[0].split("), ")) == sorted(quiet)
