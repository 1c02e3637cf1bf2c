"""Architecture configs (the registry's `zbench/model_configs/*.json`, or a user's): read, check and summarise.

A config file is {"family": "gpt" | "hf", "source": "...", "config": {...}}: `gpt` builds zbench's own
GPT (`GPTConfig` fields), `hf` builds a transformers model from `AutoConfig.for_model(**config)`.
The numbers come from the public model cards; `source` says which. A Hugging Face `config.json` (it has
a "model_type" and no "family") is read as an `hf` config as it stands; names resolve in models/registry.py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Literal

from zero_core import ConfigError
from zero_core.config_file import read_json_file

from .arch_values import HF_SIZES, check_gpt, check_gpt_shape, check_hf
from .gpt import GPT_RANGES, GPTConfig
from .registry import names, resolve

MAX_FILE_BYTES = 1 << 20  # 1 MiB: a model config is a few hundred bytes


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
        layers = (
            c.get("n_layer") or c.get("num_hidden_layers") or (c.get("encoder_layers", 0) + c.get("decoder_layers", 0))
        )
        hidden = c.get("n_embd") or c.get("hidden_size") or c.get("d_model")
        if not layers or not hidden:
            raise ConfigError(
                f"model config '{self.name}' names no layer count or hidden size "
                "(n_layer/num_hidden_layers and n_embd/hidden_size/d_model); add them"
            )
        return int(layers), int(hidden)

    @property
    def max_positions(self) -> int | None:
        c = self.config
        return c.get("block_size") or c.get("max_position_embeddings") or c.get("n_positions")

    @property
    def vocab_size(self) -> int | None:
        return self.config.get("vocab_size")


def resolve_arch_path(arch: str, base_dir: str) -> str:
    """`arch` is a config name (the scenario's models/ folder, then the registry), a .json path or a model folder."""
    return resolve(arch, base_dir)


def _read_json(path: str) -> Any:
    """The config file's JSON through zero_core's reader (duplicate keys refused), bounded in size and depth;
    NaN/Infinity, which json reads, are refused by the value checks."""
    if os.path.getsize(path) > MAX_FILE_BYTES:
        raise ConfigError(
            f"model config {path} is larger than {MAX_FILE_BYTES >> 20} MiB; a model config is a short "
            "JSON file: pass one"
        )
    try:
        return read_json_file(path)
    except RecursionError:
        raise ConfigError(f"model config {path} nests too deeply to be a model config; fix the file") from None


def load_arch(
    arch: str, base_dir: str, overrides: dict[str, Any] | None = None, where: str = "model.overrides"
) -> ArchConfig:
    """Read and check one architecture config; `overrides` (named `where` in messages) replace fields of
    its "config". Every value is checked here, before anything is built or launched."""
    path = resolve_arch_path(arch, base_dir)
    if not os.path.isfile(path):
        raise ConfigError(
            f"model.arch '{arch}': no model config file {path}; use a shipped name "
            f"({', '.join(names())}), a path to a .json file or a model folder with a config.json"
        )
    raw = _read_json(path)
    name = os.path.basename(path)[:-5]
    if name == "config":  # a model folder's config.json: the folder names the model
        name = os.path.basename(os.path.dirname(path)) or name
    if isinstance(raw, dict) and "family" not in raw and "model_type" in raw:  # a Hugging Face config.json
        raw = {"family": "hf", "config": raw, "source": path}
    if not isinstance(raw, dict) or raw.get("family") not in ("gpt", "hf") or not isinstance(raw.get("config"), dict):
        raise ConfigError(f'model config {path} must be {{"family": "gpt"|"hf", "config": {{...}}}}; fix the file')
    unknown = sorted(set(raw) - {"family", "config", "source"})
    if unknown:
        raise ConfigError(f"model config {path} has unknown key '{unknown[0]}'; the keys are family, config, source")
    base, overrides = raw["config"], overrides or {}
    try:
        _check_values(raw["family"], base, {}, lambda key: f"model config {path}: config.{key}")
    except ConfigError as e:
        raise ConfigError(f"{e}; fix the file") from None
    _check_values(raw["family"], overrides, base, lambda key: f"{where}.{key}")
    config = {**base, **overrides}
    if raw["family"] == "gpt":
        check_gpt_shape(config, f"model config '{name}'" + (f" with {where}" if overrides else ""))
    elif "model_type" not in config:
        raise ConfigError(f"model config {path}: an hf config needs 'model_type' (e.g. \"deberta-v2\"); add it")
    return ArchConfig(name=name, family=raw["family"], config=config, source=str(raw.get("source", "")))


def _check_values(family: str, config: dict[str, Any], base: dict[str, Any], label: Callable[[str], str]) -> None:
    if family == "gpt":
        check_gpt(config, label)
    else:
        check_hf(config, base, label)


def size_keys(arch: ArchConfig) -> list[str]:
    """The whole-number size fields of `arch` that a model search may vary (e.g. n_layer)."""
    if arch.family == "gpt":
        return list(GPT_RANGES)
    return sorted(k for k in HF_SIZES if k in arch.config)


def gpt_config(arch: ArchConfig) -> GPTConfig:
    """The GPTConfig of a `gpt`-family config (its values were checked by load_arch)."""
    check_gpt(arch.config, lambda key: f"model config '{arch.name}': {key}")
    check_gpt_shape(arch.config, f"model config '{arch.name}'")
    return GPTConfig(**arch.config)
