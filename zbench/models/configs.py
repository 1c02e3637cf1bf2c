"""Architecture configs (`scenarios/models/*.json`): read, check and summarise them.

A config file is {"family": "gpt" | "hf", "source": "...", "config": {...}}: `gpt` builds zbench's own
GPT (`GPTConfig` fields), `hf` builds a transformers model from `AutoConfig.for_model(**config)`.
The numbers come from the public model cards; `source` says which.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from typing import Any, Literal

from zero_core import ConfigError

from .gpt import GPTConfig

MODELS_DIR = "models"  # next to the scenario files: scenarios/models/


@dataclass(frozen=True)
class ArchConfig:
    """One architecture config, with the overrides of a scenario applied."""

    name: str
    family: Literal["gpt", "hf"]
    config: dict[str, Any]
    source: str = ""

    def shape(self) -> tuple[int, int]:
        """(layers, hidden size) for the FLOP count; an encoder-decoder counts both stacks."""
        c = self.config
        layers = c.get("n_layer") or c.get("num_hidden_layers") or (c.get("encoder_layers", 0) + c.get("decoder_layers", 0))
        hidden = c.get("n_embd") or c.get("hidden_size") or c.get("d_model")
        if not layers or not hidden:
            raise ConfigError(f"model config '{self.name}' names no layer count or hidden size "
                              "(n_layer/num_hidden_layers and n_embd/hidden_size/d_model); add them")
        return int(layers), int(hidden)

    @property
    def max_positions(self) -> int | None:
        c = self.config
        return c.get("block_size") or c.get("max_position_embeddings") or c.get("n_positions")

    @property
    def vocab_size(self) -> int | None:
        return self.config.get("vocab_size")


def available(models_dir: str) -> list[str]:
    """Names of the configs in `models_dir` (file stems)."""
    try:
        return sorted(f[:-5] for f in os.listdir(models_dir) if f.endswith(".json"))
    except OSError:
        return []


def resolve_arch_path(arch: str, base_dir: str) -> str:
    """`arch` is a config name (looked up in `<base_dir>/models/`) or a path to a .json file."""
    if arch.endswith(".json") or os.sep in arch or "/" in arch:
        return arch if os.path.isabs(arch) else os.path.normpath(os.path.join(base_dir, arch))
    return os.path.join(base_dir, MODELS_DIR, f"{arch}.json")


def load_arch(arch: str, base_dir: str, overrides: dict[str, Any] | None = None) -> ArchConfig:
    """Read and check one architecture config; `overrides` replace fields of its "config"."""
    path = resolve_arch_path(arch, base_dir)
    if not os.path.isfile(path):
        models_dir = os.path.join(base_dir, MODELS_DIR)
        names = ", ".join(available(models_dir)) or "none"
        raise ConfigError(f"model.arch '{arch}': no model config file {path}; use one of {models_dir}/*.json ({names}) "
                          "or a path to a .json file")
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except json.JSONDecodeError as e:
        raise ConfigError(f"model config {path} is not valid JSON: {e.msg} at line {e.lineno}; fix the file") from None
    name = os.path.basename(path)[:-5]
    if not isinstance(raw, dict) or raw.get("family") not in ("gpt", "hf") or not isinstance(raw.get("config"), dict):
        raise ConfigError(f"model config {path} must be {{\"family\": \"gpt\"|\"hf\", \"config\": {{...}}}}; fix the file")
    unknown = sorted(set(raw) - {"family", "config", "source"})
    if unknown:
        raise ConfigError(f"model config {path} has unknown key '{unknown[0]}'; the keys are family, config, source")
    config = {**raw["config"], **(overrides or {})}
    arch_cfg = ArchConfig(name=name, family=raw["family"], config=config, source=str(raw.get("source", "")))
    if arch_cfg.family == "gpt":
        gpt_config(arch_cfg)  # check the fields now, before anything launches
    elif "model_type" not in config:
        raise ConfigError(f"model config {path}: an hf config needs 'model_type' (e.g. \"deberta-v2\"); add it")
    return arch_cfg


def gpt_config(arch: ArchConfig) -> GPTConfig:
    """The GPTConfig of a `gpt`-family config; unknown fields are errors naming the valid ones."""
    valid = {f.name for f in fields(GPTConfig)}
    bad = sorted(set(arch.config) - valid)
    if bad:
        import difflib

        close = difflib.get_close_matches(bad[0], sorted(valid), n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"valid fields: {', '.join(sorted(valid))}"
        raise ConfigError(f"model config '{arch.name}': unknown GPT field '{bad[0]}'; {hint}")
    cfg = GPTConfig(**arch.config)
    if cfg.n_embd % cfg.n_head:
        raise ConfigError(f"model config '{arch.name}': n_embd {cfg.n_embd} is not divisible by n_head {cfg.n_head}")
    return cfg
