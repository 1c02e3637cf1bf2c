"""The scenario YAML: what to train, on what data, and which engine variants to compare.

    model:    {arch: tiny-gpt}            # a shipped model config (zbench/model_configs/), random init
              {pretrained: ./my-model}    # a local folder or a hub id (needs transformers)
    data:     {synthetic: {vocab: 512}} | {mrpc_tsv: DIR} | {mrpc_hf: DIR or cache} | {text_files: [a.txt, b.txt]}
              | {text_pairs: {train: a.jsonl, eval: b.jsonl}}
    task: lm | classification | seq2seq | token_classification
    precision, seq_len, epochs or steps, batch_size (absent: OOM-safe search), gpus, gpu_memory_cap_gib
    variants: [{name: zero2, engine: zero, stage: 2}, {name: ddp, engine: ddp}, ...]

Parsing is strict like zero_core's configs: an unknown key is a one-line error naming its path and the
closest valid key (zero_core's formatter, reused). Paths in a scenario are relative to the scenario file.
Checks that need the machine (files, DeepSpeed, GPU count) live in `plan.py`.
"""

from __future__ import annotations

import os
import re
import typing
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationError, model_validator

from zero_core.config_errors import leaf

from .limits import (
    MAX_EPOCHS,
    MAX_GRAD_ACCUM,
    MAX_LABELS,
    MAX_RANKS,
    MAX_SEED,
    MAX_STEPS,
    MAX_TIMEOUT_S,
    Batch,
    Flag,
    NonNegative,
    Positive,
    Samples,
    SeqLen,
    Steps,
    Strict,
    count,
    path_to,
    real,
)
from .run_folder import default_name, name_problem, variant_name_problem
from .scenario_data import DataSpec
from .scenario_errors import ScenarioError, translate
from .yaml_strict import read_yaml

Engine = Literal["ddp", "zero", "fsdp2", "deepspeed"]
Task = Literal["lm", "classification", "seq2seq", "token_classification"]
Metric = Literal["perplexity", "loss", "f1", "accuracy", "bleu"]
Device = Literal["none", "cpu", "nvme"]
# torch.compile backends a scenario may ask for: inductor (fused kernels, what `true` means) and
# aot_eager (dynamo + AOTAutograd without code generation: the same graphs, for checking and debugging)
CompileBackend = Literal["inductor", "aot_eager"]
COMPILE_BACKENDS = typing.get_args(CompileBackend)


def _compile_value(v: Any) -> Any:
    if v is None or isinstance(v, bool) or v in COMPILE_BACKENDS:
        return v
    backends = ", ".join(repr(b) for b in COMPILE_BACKENDS)
    raise ValueError(f"compile is true, false or a backend ({backends}), got {v!r}; use one of true, false, {backends}")


def _run_name(v: Any) -> Any:
    problem = name_problem(v)
    if problem:
        raise leaf(problem)
    return v


def _variant_name(v: Any) -> Any:
    problem = name_problem(v) or variant_name_problem(v)
    if problem:
        raise leaf(problem)
    return v


Compile = Annotated[bool | CompileBackend | None, BeforeValidator(_compile_value)]
RunName = Annotated[str, BeforeValidator(_run_name)]  # becomes a folder name: checked here, joined safely later
VariantName = Annotated[str, BeforeValidator(_variant_name)]  # a RunName that is no other variant's file

# The metric a task reports first, and every metric it can report.
TASK_METRICS: dict[str, tuple[str, ...]] = {
    "lm": ("perplexity", "loss"),
    "classification": ("f1", "accuracy", "loss"),
    "seq2seq": ("loss", "bleu"),  # BLEU needs real text pairs (greedy generation); synthetic data has loss only
    "token_classification": ("accuracy", "loss"),
}


class ModelSpec(Strict):
    arch: str | None = None  # a shipped config name, a .json path or a model folder (random init)
    pretrained: str | None = None  # a local folder or a hub id (needs transformers)
    overrides: dict[str, Any] = {}  # replace fields of the arch config (e.g. n_layer)
    tokenizer: str | None = None  # a HF tokenizer; default: the pretrained model's, else bytes
    num_labels: count(1, MAX_LABELS) | None = None  # classification heads (default 2; token classification: required)

    @model_validator(mode="after")
    def _one_source(self) -> "ModelSpec":
        if (self.arch is None) == (self.pretrained is None):
            which = "both" if self.arch is not None else "neither"
            raise ValueError(f"model sets {which} of model.arch and model.pretrained; give exactly one of model.arch "
                             "(a config in scenarios/models/) or model.pretrained")
        return self


class BatchSearch(Strict):
    """The OOM-safe search for the largest batch per GPU (each try is a fresh launch)."""

    start: Batch = 1
    max: Batch = 1024
    steps: count(1, 1000) = 2  # optimizer steps per try (the first one allocates the optimizer state)
    multiple_of: Batch = 1  # try only multiples of this (fewer launches for big models)

    @model_validator(mode="after")
    def _something_to_try(self) -> "BatchSearch":
        if -(-self.start // self.multiple_of) * self.multiple_of > self.max:
            multiple = f"that is a multiple of {self.multiple_of} " if self.multiple_of > 1 else ""
            raise ValueError(
                f"no batch {multiple}lies between start {self.start} and max {self.max}; raise max or lower start"
            )
        return self


class ModelSearch(Strict):
    """Find the largest model that fits: try `values` of one arch field (e.g. n_layer), largest fitting wins."""

    key: str  # checked against the arch in plan.py (a size field of the model)
    values: list[Samples] = Field(min_length=1, max_length=64)  # each checked as that field


class VariantSpec(Strict):
    name: VariantName
    engine: Engine
    label: str | None = None  # the "Method" column; default from engine and stage
    stage: count(0, 3) | None = None  # zero/deepspeed; default: the config's, else 2
    offload_optimizer: Device | None = None
    offload_param: Device | None = None
    # folder for offload_optimizer/offload_param: nvme (relative to the scenario file)
    nvme_path: path_to("a folder for the offloaded states") | None = None
    ds_config: path_to("a DeepSpeed JSON file") | None = None
    accelerate_config: path_to("an Accelerate YAML file") | None = None  # with distributed_type: DEEPSPEED
    batch_size: Batch | None = None  # per GPU; overrides the scenario's
    model_overrides: dict[str, Any] = {}  # arch fields for this variant only (e.g. a wider minGPT for ZeRO-3)
    compile: Compile = None  # this variant's torch.compile; default: the scenario's
    gradient_checkpointing: Flag | None = None  # this variant's recompute; default: the scenario's

    @model_validator(mode="after")
    def _engine_settings(self) -> "VariantSpec":
        sharded = self.engine in ("zero", "deepspeed")
        if not sharded:
            for key in ("stage", "offload_optimizer", "offload_param", "nvme_path", "ds_config", "accelerate_config"):
                if getattr(self, key) is not None:
                    raise ValueError(
                        f"'{key}' applies to zero and deepspeed variants, not engine '{self.engine}'; remove it"
                    )
        if self.nvme_path is not None and "nvme" not in (self.offload_optimizer, self.offload_param):
            raise ValueError(
                "'nvme_path' goes with offload_optimizer or offload_param: nvme; set one or remove nvme_path"
            )
        if self.ds_config and self.accelerate_config:
            raise ValueError("ds_config and accelerate_config are both set; give one of them, not both")
        return self


class Scenario(Strict):
    name: RunName | None = None  # default: the file name
    description: str | None = None
    model: ModelSpec
    data: DataSpec
    task: Task = "lm"
    metric: Metric | None = None  # the headline metric; default: the task's first
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    seq_len: SeqLen
    target_len: SeqLen | None = None  # seq2seq decoder length (default seq_len)
    epochs: count(1, MAX_EPOCHS) | None = None
    steps: count(1, MAX_STEPS) | None = None  # optimizer steps instead of epochs (reported as one epoch)
    batch_size: Batch | None = None  # per GPU; absent: OOM-safe search per variant
    eval_batch_size: Batch | None = None
    # without eval_batch_size: also find the largest eval batch (an "Eval size (max)" column)
    search_eval_batch: Flag = False
    grad_accum: count(1, MAX_GRAD_ACCUM) = 1
    gradient_checkpointing: Flag = False  # recompute each block in backward: activation memory for compute
    # torch.compile each repeated block's forward, for every variant (a variant's own `compile` overrides):
    # true = inductor; engines' hooks stay outside the compiled code, so every engine gets the same model
    compile: Compile = False
    lr: Positive = 1e-3
    weight_decay: NonNegative = 0.0
    warmup_steps: Steps = 0
    max_grad_norm: NonNegative = 1.0
    seed: count(0, MAX_SEED) = 0
    gpus: count(1, MAX_RANKS) = 1  # ranks per node
    gpu_memory_cap_gib: Positive | None = None  # pretend the GPU is this small
    batch_search: BatchSearch = BatchSearch()
    model_search: ModelSearch | None = None
    parity_tol: Positive | None = None  # default: 1e-3 fp32, 5e-2 bf16/fp16
    checkpoint_every: count(1, MAX_STEPS) | None = None  # optimizer steps between zero_core checkpoints (zero variants)
    # a collective waiting longer fails, naming itself
    comm_timeout_s: real(0, MAX_TIMEOUT_S, lo_open=True) | None = None
    timing_skip_steps: Steps = 0  # first optimizer steps left out of tokens/s and step time
    # time forward+backward alone on one device + the optimizer phase (the "vs floor" column)
    measure_floor: Flag = False
    # pad each micro-batch only to its longest row, as Hugging Face's examples do without --pad_to_max_length
    dynamic_padding: Flag = False
    # PYTORCH_CUDA_ALLOC_CONF for every variant's ranks, e.g. "expandable_segments:True" (no fragmentation
    # between the cap and what is allocated); the same for all engines, so the comparison stays fair
    cuda_alloc_conf: str | None = None
    variants: list[VariantSpec] = Field(min_length=1, max_length=256)

    @model_validator(mode="after")
    def _consistent(self) -> "Scenario":
        if self.cuda_alloc_conf is not None and not re.fullmatch(r"\w+:[\w.]+(,\w+:[\w.]+)*", self.cuda_alloc_conf):
            raise ValueError(
                f"cuda_alloc_conf '{self.cuda_alloc_conf}' is not PYTORCH_CUDA_ALLOC_CONF's "
                "'key:value,key:value' form; e.g. 'expandable_segments:True'"
            )
        if (self.epochs is None) == (self.steps is None):
            which = "neither 'epochs' nor 'steps'" if self.epochs is None else "both 'epochs' and 'steps'"
            raise ValueError(f"the scenario sets {which}; give exactly one of them")
        if self.metric is not None and self.metric not in TASK_METRICS[self.task]:
            raise ValueError(
                f"metric '{self.metric}' does not apply to task '{self.task}'; "
                f"use one of {', '.join(TASK_METRICS[self.task])}"
            )
        if self.steps is not None and self.timing_skip_steps >= self.steps:
            raise ValueError(
                f"timing_skip_steps {self.timing_skip_steps} leaves none of the {self.steps} steps to time; lower it"
            )
        if self.measure_floor and self.batch_size is None:
            raise ValueError("measure_floor needs the scenario's batch_size (the floor is timed at one batch); set it")
        padded = self.task in ("classification", "token_classification")  # rows with an attention_mask
        if self.dynamic_padding and not padded:
            raise ValueError(
                f"dynamic_padding applies to classification and token_classification, not task '{self.task}'; remove it"
            )
        if self.dynamic_padding and self.measure_floor:
            raise ValueError("measure_floor times one fixed batch shape, dynamic_padding varies it; drop one of them")
        lengths = self.data.synthetic.lengths if self.data.synthetic is not None else None
        if lengths is not None and not padded:
            raise ValueError(
                f"data.synthetic.lengths applies to classification and token_classification, not task "
                f"'{self.task}'; remove it"
            )
        if lengths is not None and lengths.min > self.seq_len:
            raise ValueError(f"data.synthetic.lengths.min {lengths.min} exceeds seq_len {self.seq_len}; lower it")
        names = [v.name for v in self.variants]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"variant name '{dupes[0]}' is used twice; names must be unique")
        return self

    def compile_backend(self, variant: VariantSpec | None = None) -> str | None:
        """The torch.compile backend for `variant` (the scenario's when it sets none), None for eager."""
        value = self.compile if variant is None or variant.compile is None else variant.compile
        return "inductor" if value is True else (value or None)

    def recomputes(self, variant: VariantSpec | None = None) -> bool:
        """Whether `variant`'s model recomputes each block in backward (the scenario's when it sets nothing)."""
        own = None if variant is None else variant.gradient_checkpointing
        return self.gradient_checkpointing if own is None else own

    @property
    def headline_metric(self) -> str:
        return self.metric or TASK_METRICS[self.task][0]

    @property
    def tolerance(self) -> float:
        return self.parity_tol or (1e-3 if self.precision == "fp32" else 5e-2)


def parse_scenario(data: Any, name: str = "scenario") -> Scenario:
    """Validate scenario data (already parsed YAML); the name defaults to `name`."""
    if not isinstance(data, dict):
        got = {list: "a list", str: "a single string"}.get(type(data), f"a {type(data).__name__}")
        raise ScenarioError(
            f"a scenario must be a YAML mapping, got {got}; write one 'key: value' per line "
            "(model, data, seq_len, variants, ...)"
        )
    try:
        sc = Scenario.model_validate(data)
    except ValidationError as err:
        raise translate(err, Scenario) from None
    return sc if sc.name else sc.model_copy(update={"name": name})


def load_scenario(path: str) -> Scenario:
    """Read and validate a scenario file (syntax and schema only; see plan.py for the machine checks)."""
    data = read_yaml(path, "scenario", ScenarioError)
    if data is None:
        raise ScenarioError(
            f"scenario {path} is empty; write the scenario's keys (model, data, seq_len, variants, ...)"
        )
    return parse_scenario(data, default_name(os.path.splitext(os.path.basename(path))[0]))
