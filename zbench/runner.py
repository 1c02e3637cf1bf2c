"""`zbench run`: each variant of a scenario in its own launch, measured, compared, written out.

Per variant: the model-size and batch searches the scenario asks for (each try a fresh launch, OOM-safe), then
one launch that trains, evaluates and measures. Rows that cannot run (not supported yet, out of memory or disk,
a failed rank) stay in the table with the reason and the other variants still run; a failed rank is reported
again, in full, after the table. Then loss parity against ddp, the files (results.json/csv, table.md, plots)
and W&B, on the node that holds global rank 0; other nodes only launch their ranks and keep their logs.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

from zero_core import memory_estimate as estimate

from . import __version__
from .interrupt import raise_if_dropped
from .launch import Nodes, OutOfMemory, RankFailure, launch, short_word, shortfall, start_method, untrained_note
from .models.configs import ArchConfig
from .plan import Plan, VariantPlan, variant_job
from .probe_log import ProbeLog
from .progress import ProgressView
from .parity import add_parity
from .results import add_floor_ratio, base_row, measured_row, write_outputs
from .run_folder import mark_run_folder, new_run_dir, run_path, write_atomic
from .run_summary import load_kept
from .search import largest_fitting, largest_fitting_value, train_stepping_down
from .wandb_log import wandb_spec

_ENGINE_MODULES = {"ddp": ("zbench.variants.ddp",), "zero": ("zbench.variants.zero",),
                   "fsdp2": ("zbench.variants.fsdp2",), "deepspeed": ("zbench.variants.deepspeed", "deepspeed")}
# How many batch steps below the searched maximum training tries when a whole epoch runs out of memory there.
TRAIN_STEP_DOWNS = 3


@dataclass
class RunOptions:
    out: str = "runs"
    wandb: str = "offline"  # offline | online | off
    resume: str | None = None  # an earlier run folder: finished variants are kept, the rest run
    nodes: Nodes | None = None  # default: one node with the plan's ranks
    progress: bool = True
    fork_ok: bool = False  # this process has run no torch op: CPU ranks may be forked (see launch.py)


def say(message: str) -> None:
    """Status lines go to stderr: stdout ends with the table."""
    print(message, file=sys.stderr, flush=True)


class Runner:
    def __init__(self, plan: Plan, opts: RunOptions) -> None:
        self.plan, self.opts = plan, opts
        self.nodes = opts.nodes or Nodes(plan.procs_per_node)
        self.run_dir = opts.resume or new_run_dir(opts.out, str(plan.scenario.name), self.nodes.node_rank)
        self.launches, self.short = 0, None  # short: what the last probe ran out of (OutOfMemory.resource)
        self.probes: dict[str, ProbeLog] = {}  # per variant: the outcome of each batch or model-size probe
        self.writer = self.nodes.node_rank == 0  # corrected by the first launch: whoever gets global rank 0
        self.failures: list[RankFailure] = []  # variants whose ranks failed (not OOM): rows, then one error

    # -- launches -----------------------------------------------------------------------------
    def _launch(self, vp: VariantPlan, arch: ArchConfig | None, batch: int, mode: str,
                eval_batch: int | None = None) -> dict[int, Any]:
        from .worker import run_job

        index = self.launches
        self.launches += 1
        log_dir = run_path(self.run_dir, "logs", vp.name)
        os.makedirs(log_dir, exist_ok=True)
        progress = run_path(self.run_dir, "logs", vp.name, f"progress-{index}.jsonl")
        job = {**variant_job(self.plan, vp, arch, batch, mode, eval_batch), "progress": progress}
        if mode == "train" and self.opts.wandb != "off":
            job["wandb"] = wandb_spec(self.run_dir, self.plan, vp.name, self.opts.wandb, job["ds"])
        if (mode == "train" and vp.spec.engine == "zero" and self.plan.scenario.checkpoint_every
                and not self.plan.simulated):
            # a rerun with --resume continues from here, on any number of ranks
            job["checkpoint_dir"] = self._checkpoint_dir(vp)
        sizes = f"batch {batch}" + (f", eval batch {eval_batch}" if eval_batch else "")
        with ProgressView(job["progress"], f"{vp.name} ({sizes})", enabled=self.opts.progress):
            res = launch(run_job, json.dumps(job), self.nodes, run_id=f"{vp.name}-{mode}{index}", log_dir=log_dir,
                         index=index, what=f"variant '{vp.name}' ({mode}, {sizes})", fork_ok=self.opts.fork_ok)
        self.writer = 0 in res
        return res

    def _checkpoint_dir(self, vp: VariantPlan) -> str:
        return run_path(self.run_dir, "checkpoints", vp.name)

    def _finished(self, row: dict[str, Any], vp: VariantPlan) -> bool:
        """A kept row needs no rerun: not failed, and not killed after saving a checkpoint (a rank killed by
        SIGKILL reads as out of memory, but one that had checkpointed can go on from there)."""
        if row.get("status") == "failed":
            return False
        return not (row.get("status") == "oom" and os.path.isfile(os.path.join(self._checkpoint_dir(vp), "latest")))

    def measure_floor(self) -> dict[str, float] | None:
        """Forward+backward alone on one device plus the optimizer phase for one rank's shard (zbench/floor.py)."""
        from .worker import run_job

        sc = self.plan.scenario
        if not sc.measure_floor or self.nodes.nnodes > 1 or self.nodes.node_rank:
            return None
        kept = run_path(self.run_dir, "floor.json")
        if self.opts.resume and os.path.lexists(kept):  # the kept rows were compared with this one
            return load_kept(self.run_dir, kept, "floor")
        say(f"[floor] forward+backward alone on one device, batch {sc.batch_size}, plus the optimizer phase")
        log_dir = run_path(self.run_dir, "logs", "floor")
        os.makedirs(log_dir, exist_ok=True)
        job = {"scenario": sc.model_dump(mode="json"), "base_dir": self.plan.base_dir,
               "arch": asdict(self.plan.arch) if self.plan.arch else None, "engine": None, "ds": None,
               "batch": sc.batch_size, "mode": "floor", "world_size": self.plan.world_size,
               "compile": sc.compile_backend(), "recompute": sc.recomputes()}
        res = launch(run_job, json.dumps(job), Nodes(1), run_id="floor", log_dir=log_dir, index=self.launches,
                     what="the floor measurement", fork_ok=self.opts.fork_ok)
        self.launches += 1
        floor = {**{k: v for k, v in res[0].items() if k != "rank"}, "batch": sc.batch_size}
        write_atomic(kept, json.dumps(floor))
        return floor

    def _fits(self, vp: VariantPlan, arch: ArchConfig | None, batch: int, eval_batch: int | None = None) -> bool:
        """Whether a few training steps at `batch` fit (or, given `eval_batch`, one step then eval batches of it);
        a probe made before an interruption is kept (probe_log.py)."""
        what = f"eval batch {eval_batch}" if eval_batch else f"batch {batch}"
        if self.plan.scenario.model_search and arch is not None:
            key = self.plan.scenario.model_search.key
            what = f"{key}={arch.config[key]}, {what}"

        def run() -> tuple[str, str] | None:
            try:
                self._launch(vp, arch, batch, "eval_probe" if eval_batch else "probe", eval_batch)
            except OutOfMemory as e:  # out of memory, or of disk space (NVMe states that did not fit)
                return shortfall(e), e.resource
            return None

        setup = {"ranks": self.plan.world_size, "simulated": self.plan.simulated, "nodes": self.plan.nnodes}
        log = self.probes.setdefault(vp.name, ProbeLog(self.run_dir, vp.name, setup, self.opts.resume))
        short_of, self.short, kept = log.probe(what, run)  # a kept probe's kind names the row as a fresh one's does
        kept_note = " (kept from the run resumed)" if kept else ""
        say(f"[{vp.name}] {what}: {short_of or 'fits'}{kept_note}")
        return short_of is None

    def _train(self, vp: VariantPlan, arch: ArchConfig | None, batch: int,
               eval_batch: int | None) -> dict[int, dict[str, Any]] | None:
        """The training launch; None for an out-of-memory end kept from the run resumed (the probe log keeps
        each one, so --resume does not train that batch again)."""
        log = self.probes.get(vp.name)
        what = f"training at batch {batch}"
        if log is not None and (kept := log.kept_short_of(what)):
            say(f"[{vp.name}] {what}: {kept} (kept from the run resumed)")
            return None
        try:
            return self._launch(vp, arch, batch, "train", eval_batch)
        except OutOfMemory as e:
            if log is not None:
                log.record(what, shortfall(e), e.resource)
            raise

    # -- one variant ----------------------------------------------------------------------------
    def run_variant(self, vp: VariantPlan) -> dict[str, Any]:
        sc = self.plan.scenario
        row = base_row(vp.name, vp.label, vp.spec.engine, vp.stage, "ok")
        if vp.status == "unsupported":
            say(f"[{vp.name}] skipped: {vp.reason}")
            return {**row, "status": "unsupported", "note": vp.reason}
        arch = vp.arch
        if sc.model_search and arch is not None:
            key = sc.model_search.key

            def sized(value: int) -> ArchConfig:
                return replace(arch, config={**arch.config, key: value})  # type: ignore[arg-type]

            value = largest_fitting_value(lambda x: self._fits(vp, sized(x), vp.batch or sc.batch_search.start),
                                          sc.model_search.values)
            if value is None:
                least = min(sc.model_search.values)
                return {**row, "status": "oom", "note": f"{short_word(self.short)} even at {key}={least}"}
            arch = sized(value)
            row["model_search"] = {key: value}
        batch, searched = vp.batch, False
        if batch is None:
            bs = sc.batch_search
            step = f", multiples of {bs.multiple_of}" if bs.multiple_of > 1 else ""
            say(f"[{vp.name}] searching the largest batch per GPU ({bs.start}..{bs.max}{step})")
            batch = largest_fitting(lambda b: self._fits(vp, arch, b), bs.start, bs.max, bs.multiple_of)
            searched = True
            if batch is None:
                short = short_word(self.short, "OOM Error")
                return {**row, "status": "oom", "note": f"{short} even at batch {sc.batch_search.start}"}
        eval_batch = None
        if sc.search_eval_batch and sc.eval_batch_size is None:  # the articles' "Eval Size Max"
            bs = sc.batch_search
            say(f"[{vp.name}] searching the largest eval batch per GPU after a step at batch {batch}")
            eval_batch = largest_fitting(lambda b: self._fits(vp, arch, batch, b), bs.start, bs.max, bs.multiple_of)
            if eval_batch is None:
                short = f"{short_word(self.short)} in eval"
                return {**row, "status": "oom", "batch": batch, "note": f"{short} even at eval batch {bs.start}"}
        world = self.plan.world_size
        ranks = f"rank 0 of {world}, simulated" if self.plan.simulated else f"{world} rank(s)"
        oom: list[OutOfMemory] = []

        def train(b: int) -> dict[int, dict[str, Any]] | None:
            say(f"[{vp.name}] training: batch {b} per rank on {ranks}")
            try:
                return self._train(vp, arch, b, eval_batch)
            except OutOfMemory as e:
                say(f"[{vp.name}] training at batch {b}: {shortfall(e)}")
                oom.append(e)
                return None

        # A short probe can fit where a whole epoch does not (the allocator fragments over the steps).
        downs = TRAIN_STEP_DOWNS if searched else 0
        trained, res = train_stepping_down(train, batch, sc.batch_search.start, sc.batch_search.multiple_of, downs)
        if res is None:
            return {**row, "status": "oom", "batch": trained, "note": untrained_note(oom[-1] if oom else None, trained)}
        if trained != batch:
            row["train_oom_batch"] = batch
        if 0 not in res:
            return {**row, "status": "remote"}  # this node does not hold rank 0: nothing to measure here
        r0 = res[0]
        stage = 3 if vp.spec.engine == "fsdp2" else (vp.stage or 0)  # FSDP2 shards like ZeRO-3
        zero = (r0.get("ds_config") or {}).get("zero_optimization") or {}
        offloaded = {f"offload_{k}": isinstance(zero.get(f"offload_{k}"), dict)
                     and zero[f"offload_{k}"].get("device", "none") != "none" for k in ("optimizer", "param")}
        est = estimate.model_states_gib(stage, r0["n_params"], r0["largest_layer"], self.plan.gpus, self.plan.nnodes,
                                        **offloaded)
        if "model_search" in row:
            row["model_search"]["n_params"] = n = r0["n_params"]
            shape = {**vp.spec.model_overrides, **{k: v for k, v in row["model_search"].items() if k != "n_params"}}
            size = f"{n / 1e9:.2f} B" if n >= 1e8 else f"{n / 1e6:.2f} M"
            row["note"] = ", ".join(f"{k}={v}" for k, v in shape.items()) + f" ({size} params)"
        row["eval_batch_searched"] = eval_batch is not None
        return measured_row(row, r0, seq_len=sc.seq_len, searched=searched,
                            search_step=sc.batch_search.multiple_of, est_gpu_gib=est)

    # -- the whole run ----------------------------------------------------------------------------
    def run(self) -> dict[str, Any] | None:
        """Run every variant; the summary on the writing node, None elsewhere."""
        os.makedirs(run_path(self.run_dir, "variants"), exist_ok=True)
        mark_run_folder(self.run_dir, __version__)
        with open(self.plan.path, "rb") as f:  # whole or absent: --resume checks it first
            write_atomic(run_path(self.run_dir, "scenario.yaml"), f.read())
        if start_method(self.opts.fork_ok) == "fork":  # import once here rather than in every forked rank
            for engine in {v.spec.engine for v in self.plan.variants if v.status == "ready"}:
                for module in _ENGINE_MODULES[engine]:
                    importlib.import_module(module)
            importlib.import_module("zbench.worker")
            # a torch optimizer's first add_param_group imports dynamo (seconds): every engine has one
            importlib.import_module("torch._dynamo")
        floor = self.measure_floor()
        rows = []
        for vp in self.plan.variants:
            raise_if_dropped()  # a Ctrl-C that CPython could not raise where it arrived
            cached = run_path(self.run_dir, "variants", f"{vp.name}.json")
            if self.opts.resume and os.path.lexists(cached):
                kept = load_kept(self.run_dir, cached, "row")
                if self._finished(kept, vp):  # failed variants run again (from their checkpoint, if any)
                    rows.append(kept)
                    say(f"[{vp.name}] kept from {cached}")
                    continue
            try:
                row = self.run_variant(vp)
            except RankFailure as e:  # the other variants still run; the CLI reports this after the table
                self.failures.append(e)
                first = str(e).splitlines()[0].split(": ", 1)[-1]
                row = {**base_row(vp.name, vp.label, vp.spec.engine, vp.stage, "failed"), "note": f"failed: {first}"}
                say(f"[{vp.name}] failed: {first}")
            if row["status"] != "remote":
                write_atomic(cached, json.dumps(row, default=str))
            rows.append(row)
        raise_if_dropped()
        if not self.writer:
            return None
        return self._finish(rows, floor)

    def _finish(self, rows: list[dict[str, Any]], floor: dict[str, float] | None = None) -> dict[str, Any]:
        import torch

        plan, sc = self.plan, self.plan.scenario
        add_parity(rows, sc.tolerance)
        add_floor_ratio(rows, floor)
        measured = [r for r in rows if r["status"] == "ok"]
        summary = {
            "scenario": sc.name, "scenario_file": os.path.abspath(plan.path),
            "scenario_config": sc.model_dump(mode="json"),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "task": sc.task, "headline_metric": sc.headline_metric,
            "precision": sc.precision, "world_size": plan.world_size, "nodes": plan.nnodes, "gpus_per_node": plan.gpus,
            "device": (measured or [{}])[0].get("device") or plan.device, "init": plan.init, "model": plan.model_name,
            "data_kind": plan.data_kind, "data_desc": (measured or [{}])[0].get("data"),
            "parity_tol": sc.tolerance, "notes": plan.notes, "floor": floor, "simulated": plan.simulated,
            "zbench": __version__, "torch": torch.__version__, "variants": rows,
        }
        write_outputs(self.run_dir, summary, self.opts.wandb)
        return summary

