"""The `zbench` command line."""

from __future__ import annotations

import math
import os
import sys
from typing import Any

import click

from .bounds import MAX_BATCH, MAX_RANKS, MAX_SEQ, MAX_STEPS
from .cli_lazy import LazyGroup
from .interrupt import Interrupted, interruptible
from .models.registry import gpt_names

# Every command imports what it runs when it runs: `zbench --help` loads no torch, zero_core or pandas.

MAX_NUMEL = 10**10  # elements in the kernel benchmark's partition (40 GB of fp32, plus its moments)


def _fail(message: str) -> "click.ClickException":
    return click.ClickException(message)


class _FiniteFloat(click.ParamType):
    """A float flag > 0 and finite: click's FloatRange lets 'nan' and 'inf' through."""

    name = "float"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
        if not math.isfinite(number) or number <= 0:
            self.fail(f"{value!r} is not a finite number above 0, e.g. 3e-3", param, ctx)
        return number


def _numel(text: str) -> int:
    """--numel: a whole number of elements, written 1e9 or 1000000."""
    try:
        number = float(text)
    except ValueError:
        number = math.nan
    if not (math.isfinite(number) and number.is_integer() and 1 <= number <= MAX_NUMEL):
        raise _fail(
            f"--numel {text!r} is not a whole number of elements from 1 to {MAX_NUMEL:,} (1e10); write e.g. "
            "1e9 or 1000000"
        )
    return int(number)


# name: (module, command, the one-line help `zbench --help` lists without importing the module)
LAZY = {
    "run": ("zbench.cli_run", "run", "Run every variant of SCENARIO (a YAML file) and print the comparison table."),
    "report": (
        "zbench.cli_run",
        "report",
        "Rewrite table.md, results.csv and the plots of RUN_DIR from its results.json; print the table.",
    ),
    "estimate": (
        "zbench.cli_run",
        "estimate",
        "Memory per GPU and per CPU for each ZeRO stage and offload choice (DeepSpeed's estimator).",
    ),
    "convert": (
        "zbench.cli_checkpoints",
        "convert",
        "Convert checkpoint SRC into consolidated safetensors (fp32/bf16/fp16) or a resharded zbench checkpoint.",
    ),
    "inspect": (
        "zbench.cli_checkpoints",
        "inspect",
        "Say what checkpoint SRC is (kind, step, stage, world size, params, dtypes, size) and check its files.",
    ),
}


BENCH_CHECKPOINT_HELP = (
    "Save, async save, load and convert one rank's training state: zero_core, DCP and DeepSpeed "
    "(where installed), beside the disk's O_DIRECT write/read floor measured in the same run."
)


@click.group(cls=LazyGroup, lazy=LAZY)
@click.version_option(package_name="zbench")
def main() -> None:
    """zbench: ZeRO training engine, scenario runner and checkpoint tools."""


@main.command()
@click.option(
    "--gpus",
    "nproc",
    default=2,
    show_default=True,
    type=click.IntRange(1, MAX_RANKS),
    help="Local ranks (GPUs, or CPU processes without GPUs).",
)
@click.option(
    "--stage",
    default=2,
    show_default=True,
    type=click.IntRange(0, 3),
    help="ZeRO stage (with --config: only if typed; the config's own stage must agree).",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    help='DeepSpeed-style JSON config; the flags you type fill its "auto" values.',
)
@click.option("--steps", default=30, show_default=True, type=click.IntRange(1, MAX_STEPS))
@click.option("--micro-batch", default=4, show_default=True, type=click.IntRange(1, MAX_BATCH))
@click.option(
    "--grad-accum", default=1, show_default=True, type=click.IntRange(1, MAX_BATCH), help="Gradient accumulation steps."
)
@click.option("--seq-len", default=32, show_default=True, type=click.IntRange(1, MAX_SEQ))
@click.option("--precision", default="fp32", show_default=True, type=click.Choice(["fp32", "bf16", "fp16"]))
@click.option(
    "--model",
    "preset",
    default="tiny",
    show_default=True,
    type=click.Choice(gpt_names()),
    help="A shipped GPT shape (random init).",
)
@click.option("--lr", default=3e-3, show_default=True, type=_FiniteFloat(), help="AdamW learning rate.")
@click.option(
    "--warmup",
    default=0,
    show_default=True,
    type=click.IntRange(0, MAX_STEPS),
    help="Untimed steps before the timed ones; with --config also the lr warm-up steps (warmup_num_steps).",
)
@click.pass_context
def train(
    ctx: click.Context,
    nproc: int,
    stage: int,
    config_path: str | None,
    steps: int,
    micro_batch: int,
    grad_accum: int,
    seq_len: int,
    precision: str,
    preset: str,
    lr: float,
    warmup: int,
) -> None:
    """Train a tiny GPT on synthetic tokens with zero_core (CPU-friendly default).

    With --config, the flags you type fill the config's "auto" values as Hugging Face's Trainer does
    (the run's length, --gpus and --model always do) and must agree with its explicit values."""
    from zero_core import ConfigError
    from zero_core.config import resolve_config

    from .train_config import TrainFlags, config_from_flags
    from .train_demo import TrainJob, default_ds_config, launch, preset_config

    arch = preset_config(preset)
    try:
        if config_path:
            try:
                os.close(os.open(config_path, os.O_RDONLY | os.O_NONBLOCK))  # a FIFO: never waited on
            except OSError as e:
                raise _fail(f"cannot read --config {config_path}: {e.strerror}; pass an existing DeepSpeed JSON file")
            typed = frozenset(
                name for name in ctx.params if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE
            )
            flags = TrainFlags(
                nproc, stage, steps, micro_batch, grad_accum, precision, lr, warmup, preset, arch.n_embd, typed
            )
            ds_config, filled = config_from_flags(config_path, flags)
        else:
            ds_config, filled = default_ds_config(stage, micro_batch, precision, lr, grad_accum), []
            resolve_config(ds_config, nproc)
    except ConfigError as e:
        raise _fail(str(e))
    if seq_len > arch.block_size:
        raise _fail(f"--seq-len {seq_len} exceeds the {preset} block size {arch.block_size}; use a smaller --seq-len")
    for line in filled:
        click.echo(line)
    from .train_checks import launch_problem

    problem = launch_problem(ds_config, nproc)
    if problem:
        raise _fail(problem)
    from dataclasses import asdict

    job = TrainJob(ds_config=ds_config, model=asdict(arch), steps=steps, seq_len=seq_len, warmup=warmup)
    from .launch import RankFailure

    try:
        with interruptible():
            summary = launch(job, nproc)
    except RankFailure as e:  # the rank's last log lines, then one error naming the rank; no traceback of ours
        from .rank_errors import echo_log_lines

        raise _fail(echo_log_lines(e)) from None
    except Interrupted as e:  # the launcher stopped every rank
        click.echo("interrupted; every rank was stopped", err=True)
        sys.exit(e.exit_code)
    click.echo(
        f"done: stage {summary['stage']} on {summary['world_size']} ranks, {summary['steps']} timed steps "
        f"(+{summary['warmup']} warm-up), "
        f"loss {summary['first_loss']:.4f} -> {summary['final_loss']:.4f}, "
        f"{summary['tokens_per_s']:.0f} tokens/s, {summary['step_ms']:.1f} ms/step, "
        + (f"peak {summary['peak_gib']:.1f} GiB/GPU, " if summary["peak_gib"] == summary["peak_gib"] else "")
        + f"{summary['trainable_params']:,} trainable params"
    )
    if summary.get("breakdown"):  # optimizer offload: where rank 0's step time went
        from zero_core.step_timer import format_breakdown

        click.echo(f"breakdown (rank 0, ms/step): {format_breakdown(summary['breakdown'])}")


@main.group(
    cls=LazyGroup, lazy={"checkpoint": ("zbench.cli_bench_checkpoint", "bench_checkpoint_cmd", BENCH_CHECKPOINT_HELP)}
)
def bench() -> None:
    """Micro-benchmarks."""


@bench.command("kernels")
@click.option("--numel", default="1e9", show_default=True, help="Elements in the fp32 partition (1 to 1e10).")
@click.option("--device", default=None, type=click.Choice(["cuda", "cpu"]), help="Default: cuda if available.")
def bench_kernels_cmd(numel: str, device: str | None) -> None:
    """Achieved GB/s of the reduce-epilogue and AdamW kernels next to the device's copy bandwidth."""
    import torch

    from zero_core.kernels.bench import bench_kernels, format_rows

    n = _numel(numel)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise _fail("--device cuda but no GPU is visible; use --device cpu")
    click.echo(format_rows(bench_kernels(numel=n, device=device)))


if __name__ == "__main__":
    sys.exit(main())
