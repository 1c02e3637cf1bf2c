"""The one model registry: the architecture configs zbench ships, as package data (zbench/model_configs/*.json).

A name (`gpt2-xl`, `tiny-gpt`) resolves from any folder: first `<base_dir>/models/<name>.json` when a
scenario keeps its own configs beside it, then the shipped config. A path names a zbench config file
({"family", "source", "config"}), a Hugging Face `config.json`, or a model folder holding one. `zbench run`
(model.arch), `zbench estimate --model` and `zbench train --model` all resolve through here. Imports no
torch: the command line lists the names without loading a model.
"""

from __future__ import annotations

import json
import os

REGISTRY_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "model_configs")
LOCAL_DIR = "models"  # a scenario folder's own configs: <scenario dir>/models/<name>.json
ALIASES = {"tiny": "tiny-gpt"}  # `zbench train --model tiny`


def names(folder: str = REGISTRY_DIR) -> list[str]:
    """The config names in `folder` (file stems)."""
    try:
        return sorted(f[:-5] for f in os.listdir(folder) if f.endswith(".json"))
    except OSError:
        return []


def gpt_names() -> list[str]:
    """Shipped configs of zbench's own GPT (what `zbench train` builds), plus the aliases."""
    found = []
    for name in names():
        with open(os.path.join(REGISTRY_DIR, f"{name}.json"), encoding="utf-8") as f:
            if json.load(f).get("family") == "gpt":
                found.append(name)
    return sorted(found + [a for a, target in ALIASES.items() if target in found])


def looks_like_path(arch: str) -> bool:
    return arch.endswith(".json") or os.sep in arch or "/" in arch or arch.startswith(("~", "."))


def resolve(arch: str, base_dir: str | None = None) -> str:
    """The file `arch` names (it may not exist: the caller says so): a path relative to `base_dir` (default:
    the current folder), a model folder's config.json, or a name in the scenario's models/ or the registry."""
    base = base_dir or os.getcwd()
    if looks_like_path(arch) or os.path.isdir(os.path.join(base, arch)):
        path = os.path.normpath(os.path.join(base, os.path.expanduser(arch)))
        return os.path.join(path, "config.json") if os.path.isdir(path) else path
    name = ALIASES.get(arch, arch)
    local = os.path.join(base, LOCAL_DIR, f"{name}.json")
    return local if base_dir and os.path.isfile(local) else os.path.join(REGISTRY_DIR, f"{name}.json")
