"""`zbench run`, `zbench report` and `zbench estimate`: the scenario runner's command line.

User errors (a bad scenario, a missing file, more GPUs than present) are one `Error:` line before
anything launches; a rank that fails mid-run is one error naming the rank, with its last log lines.
"""

from __future__ import annotations

import math
import os

import click

from zero_core import ConfigError


@click.command()
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option("--variants", "only", help="Comma-separated variant names to run (default: all).")
@click.option("--gpus", type=click.IntRange(1), help="Ranks per node (default: the scenario's gpus).")
@click.option("--out", default="runs", show_default=True, type=click.Path(file_okay=False), help="Parent of the run folder.")
@click.option("--wandb", "wandb_mode", default="offline", show_default=True, type=click.Choice(["offline", "online", "off"]))
@click.option("--resume", type=click.Path(file_okay=False, exists=True), help="Run folder to continue: finished variants are kept.")
@click.option("--nnodes", default=1, show_default=True, type=click.IntRange(1), help="Nodes (as torchrun).")
@click.option("--node-rank", default=0, show_default=True, type=click.IntRange(0), help="This node's rank (as torchrun).")
@click.option("--rdzv-endpoint", help="HOST:PORT of node 0 for multi-node runs (each launch uses PORT + its index).")
@click.option("--rdzv-backend", default="static", show_default=True, type=click.Choice(["static", "c10d"]))
@click.option("--rdzv-id", default="zbench", show_default=True, help="Rendezvous id shared by the nodes (c10d).")
@click.option("--simulate-ranks", "simulate", type=click.IntRange(2),
              help="Run each variant as rank 0 of N ranks in one process on one GPU (or the CPU): per-rank memory "
                   "and max batch of an N-GPU run, without communication.")
@click.option("--no-progress", is_flag=True, help="No progress bars.")
def run(scenario: str, only: str | None, gpus: int | None, out: str, wandb_mode: str, resume: str | None, nnodes: int,
        node_rank: int, rdzv_endpoint: str | None, rdzv_backend: str, rdzv_id: str, simulate: int | None,
        no_progress: bool) -> None:
    """Run every variant of SCENARIO (a YAML file) and print the comparison table."""
    from .launch import Nodes, RankFailure
    from .plan import build_plan
    from .results import markdown
    from .runner import RunOptions, Runner, check_resume, say

    names = [n.strip() for n in only.split(",") if n.strip()] if only else None
    try:
        plan = build_plan(scenario, only=names, gpus=gpus, nnodes=nnodes, simulate=simulate)
        nodes = Nodes(plan.procs_per_node, nnodes, node_rank, rdzv_endpoint, rdzv_backend, rdzv_id)
        nodes.check()
        if rdzv_endpoint and not rdzv_endpoint.rpartition(":")[2].isdigit():
            raise ConfigError(f"--rdzv-endpoint {rdzv_endpoint!r} must be HOST:PORT")
        if resume:
            check_resume(resume, scenario)
    except (ConfigError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    for note in plan.notes:
        say(f"note: {note}")
    runner = Runner(plan, RunOptions(out=out, wandb=wandb_mode, resume=resume, nodes=nodes, progress=not no_progress,
                                          fork_ok=True))  # this command has run no torch op
    _check_writable(runner.run_dir, "--resume" if resume else "--out")
    summary = runner.run()
    if summary is None:
        click.echo(f"node {node_rank}: all launches finished; the table is written by the node holding rank 0 "
                   f"(logs: {runner.run_dir})")
    else:
        click.echo(f"results: {runner.run_dir} (results.json, results.csv, table.md, *.png"
                   + (", wandb/" if wandb_mode != "off" else "") + ")\n")
        click.echo(markdown(summary), nl=False)
    if runner.failures:
        first: RankFailure = runner.failures[0]
        more = f"; {len(runner.failures) - 1} more variant(s) failed too" if len(runner.failures) > 1 else ""
        raise click.ClickException(f"{first}\n(all logs: {runner.run_dir}/logs{more})")


@click.command()
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True))
@click.option("--wandb", "wandb_mode", default="off", show_default=True, type=click.Choice(["offline", "online", "off"]),
              help="Also log the runs to W&B again.")
def report(run_dir: str, wandb_mode: str) -> None:
    """Rewrite table.md, results.csv and the plots of RUN_DIR from its results.json; print the table."""
    from .results import load_summary, markdown
    from .runner import write_outputs

    try:
        summary = load_summary(run_dir)
    except OSError as e:
        raise click.ClickException(f"{run_dir} has no readable results.json ({e.strerror}); pass a zbench run folder") from None
    except ValueError as e:
        raise click.ClickException(f"{run_dir}/results.json is not valid JSON ({e}); re-run the scenario") from None
    _check_writable(run_dir, "RUN_DIR")
    write_outputs(run_dir, summary, wandb_mode)
    click.echo(markdown(summary), nl=False)


def _check_writable(folder: str, flag: str) -> None:
    """Create `folder` if needed and make sure we may write there, before any work (one clear line if not)."""
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise click.ClickException(f"cannot create {folder} ({e.strerror}); pass a writable {flag}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise click.ClickException(f"cannot write into {folder} (permission denied); pass a writable {flag}")


def _model_counts(model: str) -> tuple[str, int, int]:
    """(name, total params, largest layer params) of an arch config, built on the meta device."""
    import torch

    from .models.configs import load_arch
    from .models.factory import build_model

    base = os.path.join(os.getcwd(), "scenarios")
    if model.endswith(".json") and not os.path.isabs(model):
        model = os.path.abspath(model)
    arch = load_arch(model, base)
    with torch.device("meta"):  # shapes only: a 45 B model costs no memory
        bundle = build_model(task="lm", arch=arch, pretrained=None)
    return arch.name, bundle.n_params, bundle.largest_layer


@click.command()
@click.option("--model", "model", required=True, help="An arch config: scenarios/models/X.json or its name X.")
@click.option("--gpus", default=1, show_default=True, type=click.IntRange(1), help="GPUs per node.")
@click.option("--nodes", default=1, show_default=True, type=click.IntRange(1))
@click.option("--run", "run_dir", type=click.Path(file_okay=False, exists=True), help="Also compare with a run's measured peaks.")
def estimate(model: str, gpus: int, nodes: int, run_dir: str | None) -> None:
    """Memory per GPU and per CPU for each ZeRO stage and offload choice (DeepSpeed's estimator)."""
    from . import estimate as est

    try:
        name, total, largest = _model_counts(model)
    except ConfigError as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"model {name}")
    click.echo(est.format_table(est.estimate(total, largest, gpus, nodes), total, largest, gpus, nodes))
    if run_dir:
        from .results import load_summary

        summary = load_summary(run_dir)
        click.echo(f"\nmeasured in {run_dir} ({summary['world_size']} rank(s); estimates for that run's layout):\n")
        click.echo("| variant | stage | est. model states GiB/GPU | measured peak GPU GiB |\n|---|---|---|---|")
        for r in summary["variants"]:
            if r["status"] != "ok":
                continue
            peak = r.get("peak_gpu_gib")
            shown = "– (CPU run)" if peak is None or (isinstance(peak, float) and math.isnan(peak)) else f"{peak:.2f}"
            click.echo(f"| {r['variant']} | {r['stage'] if r['stage'] is not None else '–'} | {r['est_gpu_gib']:.3f} | {shown} |")
