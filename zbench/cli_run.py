"""`zbench run`, `zbench report` and `zbench estimate`: the scenario runner's command line.

User errors (a bad scenario, a missing file, more GPUs than present) are one `Error:` line before
anything launches; a rank that fails mid-run prints its last log lines, then one error naming the rank.
"""

from __future__ import annotations

import math
import os
import re
import shlex
from typing import TYPE_CHECKING

import click

from .bounds import MAX_NODES, MAX_RANKS
from .interrupt import Interrupted, interruptible
from .rank_errors import echo_log_lines

if TYPE_CHECKING:
    from .models.configs import ArchConfig

MAX_PORT = 65_000  # leaves 535 ports above it for the launches of one run


@click.command()
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option("--variants", "only", help="Comma-separated variant names to run (default: all).")
@click.option("--gpus", type=click.IntRange(1, MAX_RANKS), help="Ranks per node (default: the scenario's gpus).")
@click.option(
    "--out", default="runs", show_default=True, type=click.Path(file_okay=False), help="Parent of the run folder."
)
@click.option(
    "--wandb", "wandb_mode", default="offline", show_default=True, type=click.Choice(["offline", "online", "off"])
)
@click.option(
    "--resume",
    type=click.Path(file_okay=False, exists=True),
    help="Run folder to continue: finished variants are kept.",
)
@click.option("--nnodes", default=1, show_default=True, type=click.IntRange(1, MAX_NODES), help="Nodes (as torchrun).")
@click.option(
    "--node-rank",
    default=0,
    show_default=True,
    type=click.IntRange(0, MAX_NODES - 1),
    help="This node's rank (as torchrun).",
)
@click.option("--rdzv-endpoint", help="HOST:PORT of node 0 for multi-node runs (each launch uses PORT + its index).")
@click.option("--rdzv-backend", default="static", show_default=True, type=click.Choice(["static", "c10d"]))
@click.option("--rdzv-id", default="zbench", show_default=True, help="Rendezvous id shared by the nodes (c10d).")
@click.option(
    "--simulate-ranks",
    "simulate",
    type=click.IntRange(2, MAX_RANKS),
    help="Run each variant as rank 0 of N ranks in one process on one GPU (or the CPU): per-rank memory "
    "and max batch of an N-GPU run, without communication.",
)
@click.option("--no-progress", is_flag=True, help="No progress bars.")
@click.pass_context
def run(
    ctx: click.Context,
    scenario: str,
    only: str | None,
    gpus: int | None,
    out: str,
    wandb_mode: str,
    resume: str | None,
    nnodes: int,
    node_rank: int,
    rdzv_endpoint: str | None,
    rdzv_backend: str,
    rdzv_id: str,
    simulate: int | None,
    no_progress: bool,
) -> None:
    """Run every variant of SCENARIO (a YAML file) and print the comparison table."""
    from .ds_config import make_nvme_folders
    from .launch import Nodes, RankFailure
    from .plan import build_plan
    from .printable import printable
    from .resume_folder import check_resume
    from .run_folder import RunFolderError
    from .runner import RunOptions, Runner, say
    from .terminal_table import print_table

    names = [n.strip() for n in only.split(",") if n.strip()] if only is not None else None
    if names == []:  # given, but naming nothing: not "all"
        raise click.ClickException(f"--variants {only!r} names no variant; pass variant names separated by commas, "
                                   "or leave the option out to run them all")
    runner: Runner | None = None
    with interruptible():
        try:
            try:
                _check_rendezvous(rdzv_endpoint, rdzv_id)
                plan = build_plan(scenario, only=names, gpus=gpus, nnodes=nnodes, simulate=simulate)
                nodes = Nodes(plan.procs_per_node, nnodes, node_rank, rdzv_endpoint, rdzv_backend, rdzv_id)
                nodes.check()
                if resume:
                    check_resume(resume, plan)
                for vp in plan.variants:
                    if vp.status == "ready":
                        make_nvme_folders(vp.ds_template, vp.name)
                runner = Runner(
                    plan,
                    RunOptions(
                        out=out, wandb=wandb_mode, resume=resume, nodes=nodes, progress=not no_progress, fork_ok=True
                    ),
                )  # this command ran no torch op
            except ValueError as e:  # zero_core's ConfigError and the scenario's errors: one line each
                raise click.ClickException(printable(e)) from None
            _check_writable(runner.run_dir, "--resume" if resume else "--out")
            for note in plan.notes:  # after every error about the arguments
                say(f"note: {note}")
            try:
                summary = runner.run()
            except RunFolderError as e:
                raise click.ClickException(printable(e)) from None
        except Interrupted as e:
            started = runner is not None and os.path.isfile(os.path.join(runner.run_dir, "scenario.yaml"))
            again = [
                f"--variants {shlex.quote(only)}" if only else "",
                f"--gpus {gpus}" if gpus else "",
                f"--simulate-ranks {simulate}" if simulate else "",
            ]
            command = " ".join(["zbench run", shlex.quote(scenario), *filter(None, again)])
            say(
                f"interrupted; resume with: {command} --resume {shlex.quote(runner.run_dir)}"
                if runner and started
                else f"interrupted before the run started; nothing was written; start again with: {command}"
            )
            ctx.exit(e.exit_code)
    if summary is None:
        click.echo(
            f"node {node_rank}: all launches finished; the table is written by the node holding rank 0 "
            f"(logs: {runner.run_dir})"
        )
    else:
        click.echo(
            f"results: {runner.run_dir}\nfiles: results.json, results.csv, table.md (every column), *.png"
            + (", wandb/" if wandb_mode != "off" else "")
            + "\n"
        )
        print_table(summary)
    if runner.failures:
        first: RankFailure = runner.failures[0]
        more = f" ({len(runner.failures) - 1} more variant(s) failed too)" if len(runner.failures) > 1 else ""
        # the rank's last log lines go first, so that the output ends with the one Error: line
        raise click.ClickException(f"{echo_log_lines(first)}; all logs in {runner.run_dir}/logs{more}")


def _check_rendezvous(endpoint: str | None, rdzv_id: str) -> None:
    """--rdzv-endpoint is HOST:PORT with room above PORT (one port per launch); --rdzv-id names log folders."""
    if endpoint is not None:
        host, _, port = endpoint.rpartition(":")
        if not host or not re.fullmatch(r"[0-9]{1,5}", port) or not 1 <= int(port) <= MAX_PORT:
            raise ValueError(
                f"--rdzv-endpoint {endpoint!r} must be HOST:PORT with PORT from 1 to {MAX_PORT:,} (each "
                "launch of the run uses PORT + its index); write it as HOST:PORT, e.g. node0:29500"
            )
    from .run_folder import name_problem

    problem = name_problem(rdzv_id)
    if problem:
        raise ValueError(f"--rdzv-id {problem}")


@click.command()
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True))
@click.option(
    "--wandb",
    "wandb_mode",
    default="off",
    show_default=True,
    type=click.Choice(["offline", "online", "off"]),
    help="Also log the runs to W&B again.",
)
def report(run_dir: str, wandb_mode: str) -> None:
    """Rewrite table.md, results.csv and the plots of RUN_DIR from its results.json; print the table."""
    from .printable import printable
    from .run_folder import RunFolderError
    from .run_summary import NotARunFolder, load_summary
    from .results import write_outputs
    from .terminal_table import print_table

    try:
        summary = load_summary(run_dir)  # every field the files and the table read: nothing is rewritten before
    except NotARunFolder as e:
        raise click.ClickException(printable(e)) from None
    _check_writable(run_dir, "RUN_DIR")
    try:
        write_outputs(run_dir, summary, wandb_mode, replay=True)
    except RunFolderError as e:
        raise click.ClickException(printable(e)) from None
    click.echo(f"results: {run_dir}\nrewrote: results.csv, table.md (every column), *.png\n")
    print_table(summary)


def _check_writable(folder: str, flag: str) -> None:
    """Create `folder` if needed and make sure we may write there, before any work (one clear line if not)."""
    from .printable import printable

    shown = printable(folder)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise click.ClickException(f"cannot create {shown} ({e.strerror}); pass a writable {flag}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise click.ClickException(f"cannot write into {shown} (permission denied); pass a writable {flag}")


def _model_counts(model: str) -> tuple[str, int, int]:
    """(name, total params, largest layer params) of an arch config, built on the meta device."""
    import torch

    from zero_core import ConfigError

    from .models.configs import load_arch
    from .models.factory import build_model

    arch = load_arch(model, os.getcwd())  # a shipped name resolves from any folder
    try:
        task = _whole_model_task(arch)
        with torch.device("meta"):  # shapes only: a 45 B model costs no memory
            bundle = build_model(task=task, arch=arch, pretrained=None)
    except (ValueError, TypeError) as e:  # transformers' own checks of an hf config
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"model config '{arch.name}' is refused by transformers: {e}; fix the file") from None
    return arch.name, bundle.n_params, bundle.largest_layer


def _whole_model_task(arch: ArchConfig) -> str:
    """The task whose model holds every weight of `arch`: an encoder-decoder's causal-LM class would drop its
    encoder, and an encoder (DeBERTa, Longformer) has no causal-LM class at all."""
    if arch.family == "gpt":
        return "lm"
    from .models.factory import require_transformers

    transformers = require_transformers()
    config = transformers.AutoConfig.for_model(**arch.config)
    if getattr(config, "is_encoder_decoder", False):
        return "seq2seq"
    causal = transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    return "lm" if config.model_type in causal else "classification"


@click.command()
@click.option(
    "--model",
    "model",
    required=True,
    help="A shipped model name (e.g. gpt2-xl), a config .json (zbench's or Hugging Face's) or a model folder.",
)
@click.option("--gpus", default=1, show_default=True, type=click.IntRange(1, MAX_RANKS), help="GPUs per node.")
@click.option("--nodes", default=1, show_default=True, type=click.IntRange(1, MAX_NODES))
@click.option(
    "--run", "run_dir", type=click.Path(file_okay=False, exists=True), help="Also compare with a run's measured peaks."
)
def estimate(model: str, gpus: int, nodes: int, run_dir: str | None) -> None:
    """Memory per GPU and per CPU for each ZeRO stage and offload choice (DeepSpeed's estimator)."""
    from zero_core import ConfigError

    from zero_core import memory_estimate as est
    from .printable import printable
    from .run_summary import NotARunFolder, load_summary

    try:
        summary = load_summary(run_dir) if run_dir else None  # before any output: a bad folder is the only line
        name, total, largest = _model_counts(model)
    except (ConfigError, NotARunFolder) as e:
        # the model readers name the scenario key; here the user typed --model
        raise click.ClickException(printable(str(e).replace("model.arch '", "--model '", 1))) from None
    click.echo(f"model {name}")
    click.echo(est.format_table(est.estimate(total, largest, gpus, nodes), total, largest, gpus, nodes))
    click.echo("\n" + est.format_init(total, largest, gpus))
    if summary is not None:
        click.echo(f"\nmeasured in {run_dir} ({summary['world_size']} rank(s); estimates for that run's layout):\n")
        click.echo("| variant | stage | est. model states GiB/GPU | measured peak GPU GiB |\n|---|---|---|---|")
        for r in summary["variants"]:
            if r["status"] != "ok":
                continue
            peak, est_gib = r.get("peak_gpu_gib"), r.get("est_gpu_gib")
            shown = "– (CPU run)" if peak is None or math.isnan(peak) else f"{peak:.2f}"
            click.echo(
                f"| {r['variant']} | {r['stage'] if r['stage'] is not None else '–'} | "
                f"{'–' if est_gib is None else format(est_gib, '.3f')} | {shown} |"
            )
