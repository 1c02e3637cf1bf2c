"""Expand a scenario into runnable variants and check everything that can fail before a launch.

Errors here are one line (`ScenarioError`) and nothing has started yet: unknown keys, a missing model
config or data folder, a DeepSpeed variant without DeepSpeed, more GPUs than the machine has, a zero
variant whose DeepSpeed dict zero_core rejects. A variant that asks for something its engine does not
support yet (FSDP2 with fp16) is not an error: it becomes a "not supported yet" row of the table, so
the article's scenario still runs its other variants and picks the variant up once the engine can.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from zero_core import ConfigError, UnsupportedFeature, load_config

from . import ds_config
from .accelerate_config import accelerate_num_processes
from .cpu_ranks import CPU_RANKS_PER_CORE, cpu_ranks_problem  # noqa: F401  (re-exported)
from .models.configs import ArchConfig, load_arch, size_keys
from .plan_inputs import abs_path, check_data, check_model, transformers_available  # noqa: F401  (re-exported for tests)
from .scenario import Scenario, ScenarioError, VariantSpec, load_scenario



@dataclass
class VariantPlan:
    spec: VariantSpec
    label: str
    ds_template: dict[str, Any]
    batch: int | None  # fixed per-GPU batch, or None: search for the largest that fits
    arch: ArchConfig | None  # the scenario's arch with this variant's model_overrides
    status: Literal["ready", "unsupported"] = "ready"
    reason: str = ""

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def stage(self) -> int | None:
        return self.ds_template["zero_optimization"]["stage"] if self.spec.engine in ("zero", "deepspeed") else None


@dataclass
class Plan:
    scenario: Scenario
    path: str
    base_dir: str
    arch: ArchConfig | None
    gpus: int  # ranks per node
    nnodes: int
    device: Literal["cuda", "cpu"]
    variants: list[VariantPlan]
    notes: list[str] = field(default_factory=list)
    simulated: bool = False  # one process stands for rank 0 of `gpus` ranks (--simulate-ranks)

    @property
    def procs_per_node(self) -> int:
        """Processes each launch starts here: one per rank, or one in all when simulated."""
        return 1 if self.simulated else self.gpus

    @property
    def world_size(self) -> int:
        return self.gpus * self.nnodes

    @property
    def init(self) -> str:
        return "pretrained" if self.scenario.model.pretrained else "random-init"

    @property
    def model_name(self) -> str:
        m = self.scenario.model
        if m.pretrained:
            return m.pretrained
        name = self.arch.name if self.arch else str(m.arch)
        changed = ", ".join(f"{k}={v}" for k, v in m.overrides.items())
        return f"{name} ({changed})" if changed else name

    @property
    def data_kind(self) -> str:
        return "real" if self.scenario.data.real else "synthetic"


def deepspeed_available() -> bool:
    return importlib.util.find_spec("deepspeed") is not None


def _check_gpus(gpus: int, notes: list[str], cap: float | None) -> Literal["cuda", "cpu"]:
    import torch

    present = torch.cuda.device_count()  # NVML-based: does not initialise CUDA in this process
    if present:
        if gpus > present:
            raise ScenarioError(
                f"the scenario asks for {gpus} GPUs per node but this machine has {present}; "
                f"pass --gpus {present} (or fewer)"
            )
        return "cuda"
    problem = cpu_ranks_problem(gpus)
    if problem:
        raise ScenarioError(problem)
    notes.append(f"no GPU: running {gpus} CPU rank(s) per node over gloo")
    if cap:
        notes.append("gpu_memory_cap_gib is ignored on the CPU")
    return "cpu"


def default_label(v: VariantSpec, stage: int | None, ds: dict[str, Any]) -> str:
    if v.label:
        return v.label
    if v.engine == "ddp":
        return "DDP (torch DistributedDataParallel)"
    if v.engine == "fsdp2":
        return "FSDP2 (torch fully_shard)"
    zero = ds.get("zero_optimization", {})
    by_device: dict[str, list[str]] = {}
    for part in ("optimizer", "param"):
        section = zero.get(f"offload_{part}")
        device = section.get("device", "none") if isinstance(section, dict) else "none"
        if device != "none":
            by_device.setdefault("NVMe" if device == "nvme" else device.upper(), []).append(part)
    suffix = "".join(f" + {dev} offload ({', '.join(parts)})" for dev, parts in by_device.items())
    who = "zero_core" if v.engine == "zero" else "DeepSpeed"
    return f"{who} ZeRO Stage {stage}{suffix}"


def _plan_variant(
    sc: Scenario, v: VariantSpec, base_dir: str, world: int, arch: ArchConfig | None, simulated: bool = False
) -> VariantPlan:
    try:
        ds = ds_config.template(sc, v, base_dir)
        if v.model_overrides:
            if arch is None:
                raise ConfigError("model_overrides needs model.arch (a pretrained model has a fixed shape); "
                                  "remove model_overrides or use model.arch")
            arch = load_arch(
                str(sc.model.arch),
                base_dir,
                {**sc.model.overrides, **v.model_overrides},
                where=f"variants[{sc.variants.index(v)}].model_overrides",
            )
    except ConfigError as e:
        raise ScenarioError(f"variant '{v.name}': {e}") from None
    hidden = arch.shape()[1] if arch else 1024
    stage = ds["zero_optimization"]["stage"] if v.engine in ("zero", "deepspeed") else None
    batch = v.batch_size or ds_config.fixed_batch(ds) or sc.batch_size
    plan = VariantPlan(v, default_label(v, stage, ds), ds, batch, arch)
    if v.engine == "deepspeed" and simulated:
        plan.status, plan.reason = "unsupported", "simulated ranks: DeepSpeed's communication needs real peers"
        return plan
    if v.engine == "deepspeed" and not deepspeed_available():
        raise ScenarioError(
            f"variant '{v.name}' needs DeepSpeed, which is not installed here; pip install deepspeed, "
            "or leave the variant out with --variants"
        )
    if v.engine == "fsdp2" and sc.precision == "fp16":
        plan.status, plan.reason = (
            "unsupported",
            "fsdp2 with fp16 needs a sharded grad scaler: not supported yet; use bf16",
        )
    if v.engine == "zero":
        final = ds_config.finalize(ds, sc=sc, batch=batch or 1, world_size=world, total_steps=1000, hidden=hidden)
        try:
            load_config(final, world)
        except UnsupportedFeature as e:  # a feature zero_core lacks: a row that says so, the other variants run
            plan.status, plan.reason = "unsupported", str(e)
        except ConfigError as e:  # a setting to fix: say so before launching
            raise ScenarioError(
                f"variant '{v.name}': {e}" + ("; or give the variant nvme_path: DIR" if "nvme_path" in str(e) else "")
            ) from None
    return plan


def _check_model_search(sc: Scenario, base_dir: str, arch: ArchConfig | None) -> None:
    """The searched key is a size field of the model, and every value gives a valid model."""
    search = sc.model_search
    assert search is not None
    if arch is None:
        raise ScenarioError("model_search needs model.arch (a pretrained model has a fixed shape); "
                            "remove model_search or use model.arch")
    keys = size_keys(arch)
    if search.key not in keys:
        raise ScenarioError(
            f"model_search.key '{search.key}' is not a size field of '{arch.name}'; use one of "
            f"{', '.join(keys) or '(none: the config names no sizes)'}"
        )
    for value in search.values:
        try:
            load_arch(
                str(sc.model.arch), base_dir, {**sc.model.overrides, search.key: value}, where="model_search.values"
            )
        except ConfigError as e:
            raise ScenarioError(str(e)) from None


def build_plan(
    path: str, *, only: list[str] | None = None, gpus: int | None = None, nnodes: int = 1, simulate: int | None = None
) -> Plan:
    """Load `path` and check it against this machine; raises ScenarioError (one line) on any problem.
    `simulate`: plan an N-rank world that one process runs as its rank 0 (one GPU, or the CPU)."""
    sc = load_scenario(path)
    base_dir = os.path.dirname(os.path.abspath(path))
    arch = check_model(sc, base_dir)
    check_data(sc, base_dir)
    notes: list[str] = []
    if simulate and (gpus or nnodes > 1):
        raise ScenarioError("--simulate-ranks N stands for all the ranks on one device; drop --gpus and --nnodes")
    per_node = simulate or gpus or sc.gpus
    device = _check_gpus(1 if simulate else per_node, notes, sc.gpu_memory_cap_gib)
    if simulate:
        notes.append(
            f"simulated: each variant runs as rank 0 of {simulate} in one process (torch's fake process group): "
            f"memory per rank and the batch that fits are a {simulate}-rank run's; nothing is communicated, so "
            "times are lower bounds, and losses and metrics are not a training result (no gradient is averaged; "
            "at stage 3 and FSDP2 the other ranks' weight shards never arrive; zero_core reads them as zeros) and "
            "cover rank 0's share of the eval rows"
            + ("; no checkpoints are written (rank 0 alone cannot save an N-rank one)" if sc.checkpoint_every else "")
        )
    chosen = list(sc.variants)
    if only:
        names = [v.name for v in sc.variants]
        missing = [n for n in only if n not in names]
        if missing:
            raise ScenarioError(
                f"--variants: no variant named '{missing[0]}' in {path}; the variants are {', '.join(names)}"
            )
        chosen = [v for v in sc.variants if v.name in only]
    if sc.model_search:
        _check_model_search(sc, base_dir, arch)
    plans = [_plan_variant(sc, v, base_dir, per_node * nnodes, arch, bool(simulate)) for v in chosen]
    notes += _accelerate_rank_notes(chosen, base_dir, per_node * nnodes)
    if nnodes > 1:
        if sc.model_search:
            raise ScenarioError("model_search runs on one node; remove it for a multi-node run")
        unsized = [p.name for p in plans if p.batch is None and p.status == "ready"]
        if unsized:
            raise ScenarioError(
                f"variant '{unsized[0]}' has no batch_size and the batch search runs on one node; "
                "set batch_size for a multi-node run"
            )
    return Plan(sc, path, base_dir, arch, per_node, nnodes, device, plans, notes, simulated=bool(simulate))


def _accelerate_rank_notes(chosen: list[VariantSpec], base_dir: str, world: int) -> list[str]:
    """An Accelerate YAML's num_processes is `accelerate launch`'s rank count; here the scenario's gpus (or
    --gpus) sets it for every variant alike, so a count that differs is named rather than silently not used."""
    notes = []
    for v in chosen:
        asked = accelerate_num_processes(abs_path(v.accelerate_config, base_dir)) if v.accelerate_config else None
        if asked is not None and asked != world:
            notes.append(f"variant '{v.name}': its accelerate_config sets num_processes: {asked}, but the run uses "
                         f"{world} rank(s) (the scenario's gpus x nodes); set gpus (ranks per node) in the scenario "
                         f"or pass --gpus to run {asked}")
    return notes


def variant_job(plan: Plan, vp: VariantPlan, arch: ArchConfig | None, batch: int, mode: str,
                eval_batch: int | None = None) -> dict[str, Any]:
    """What one launch of a variant runs (zbench.worker.run_job's argument, before progress and checkpoints)."""
    return {"scenario": plan.scenario.model_dump(mode="json"), "base_dir": plan.base_dir,
            "arch": asdict(arch) if arch else None, "engine": vp.spec.engine, "ds": vp.ds_template,
            "batch": batch, "eval_batch": eval_batch, "mode": mode, "compile": plan.scenario.compile_backend(vp.spec),
            "recompute": plan.scenario.recomputes(vp.spec),
            "simulate_world": plan.world_size if plan.simulated else None}
