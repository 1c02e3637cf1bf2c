"""Build the scenario's model: zbench's GPT for `gpt` configs, a transformers model otherwise.

Returns the module (no parallelism: the variants wrap it) with a `call(target, batch)` that runs a
forward on a batch dict and returns an object with `.loss` and `.logits`, whatever the model family,
plus the numbers the metrics need (parameter count, largest layer, layers, hidden size).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from zero_core import ConfigError

from .configs import ArchConfig, gpt_config
from .gpt import GPT, LMOutput
from .gpt_heads import GPTForSequenceClassification

Batch = dict[str, torch.Tensor]
Call = Callable[[Any, Batch], Any]


@dataclass
class ModelBundle:
    model: nn.Module
    call: Call
    n_params: int
    largest_layer: int
    layers: int
    hidden: int
    vocab: int | None
    blocks: list[nn.Module]  # the repeated transformer blocks (FSDP2 shards each one)
    family: str = "gpt"  # "gpt" (zbench's GPT) or "hf" (transformers)


def count_params(model: nn.Module) -> tuple[int, int]:
    """(total parameters, largest single module's own parameters); shared tensors count once."""
    total = sum(p.numel() for p in dict.fromkeys(model.parameters()))
    largest = max((sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()), default=0)
    return total, largest


def uses_dropout(model: nn.Module) -> bool:
    """Whether training draws random dropout masks: a dropout module with p > 0, or a config rate > 0 that
    the model applies functionally (zbench's GPT and many transformers models pass it to attention)."""
    if any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules()):
        return True
    cfg = getattr(model, "cfg", None) or getattr(model, "config", None)
    items = vars(cfg).items() if cfg is not None and hasattr(cfg, "__dict__") else ()
    return any(k.endswith(("dropout", "dropout_prob", "pdrop")) and isinstance(v, float) and v > 0 for k, v in items)


def require_transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise ConfigError("this model needs Hugging Face transformers, which is not installed here; "
                          "pip install transformers") from None
    return transformers


def _gpt_call(task: str) -> Call:
    if task == "lm":
        return lambda m, b: m(b["input_ids"], b["labels"])
    return lambda m, b: m(b["input_ids"], b["attention_mask"], b["labels"])


def _hf_call(task: str) -> Call:
    if task != "lm":
        return lambda m, b: m(**b)

    def lm(m: Any, b: Batch) -> LMOutput:
        # labels are already the next tokens: compute the loss here instead of letting HF shift them again
        logits = m(input_ids=b["input_ids"], attention_mask=b.get("attention_mask")).logits
        return LMOutput(logits, F.cross_entropy(logits.float().flatten(0, 1), b["labels"].flatten()))

    return lm


_HF_AUTO = {
    "lm": "AutoModelForCausalLM",
    "classification": "AutoModelForSequenceClassification",
    "token_classification": "AutoModelForTokenClassification",
    "seq2seq": "AutoModelForSeq2SeqLM",
}


def _hf_blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated layers: children of an nn.ModuleList that are, or hold, a module transformers keeps whole
    (`_no_split_modules`), innermost first. That list may name a part of a layer (Longformer names its
    self-attention); the block is the whole layer, so compiling or sharding it takes the layer at once."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    listed = [child for m in model.modules() if isinstance(m, nn.ModuleList) for child in m]
    if names:
        holders = [c for c in listed if any(type(m).__name__ in names for m in c.modules())]
        ids = {id(c) for c in holders}
        inner = [c for c in holders if sum(id(m) in ids for m in c.modules()) == 1]  # holds no other holder
        return inner or [m for m in model.modules() if type(m).__name__ in names]
    return listed


def build_model(*, task: str, arch: ArchConfig | None, pretrained: str | None, num_labels: int = 2) -> ModelBundle:
    """The model for `task`, random-init from `arch` or loaded from `pretrained`."""
    if arch is not None and arch.family == "gpt":
        cfg = gpt_config(arch)
        if task == "lm":
            model: nn.Module = GPT(cfg)
            blocks = list(model.blocks)
        elif task == "classification":
            model = GPTForSequenceClassification(cfg, num_labels)
            blocks = list(model.gpt.blocks)
        else:
            raise ConfigError(f"zbench's GPT does lm and classification, not {task}; use a transformers model")
        total, largest = count_params(model)
        return ModelBundle(model, _gpt_call(task), total, largest, cfg.n_layer, cfg.n_embd, cfg.vocab_size, blocks)
    transformers = require_transformers()
    auto = getattr(transformers, _HF_AUTO[task])
    extra = {"num_labels": num_labels} if task in ("classification", "token_classification") else {}
    if pretrained:
        config = transformers.AutoConfig.from_pretrained(pretrained, **extra)
        model = auto.from_pretrained(pretrained, config=config, ignore_mismatched_sizes=bool(extra))
    else:
        assert arch is not None
        config = transformers.AutoConfig.for_model(**arch.config, **extra)
        model = auto.from_config(config)
    total, largest = count_params(model)
    c = config.to_dict()
    layers = c.get("num_hidden_layers") or c.get("n_layer") or (c.get("encoder_layers", 0) + c.get("decoder_layers", 0))
    hidden = c.get("hidden_size") or c.get("d_model") or c.get("n_embd")
    return ModelBundle(model, _hf_call(task), total, largest, int(layers), int(hidden), c.get("vocab_size"),
                       _hf_blocks(model), family="hf")
