"""Every DeepSpeed-style dict of every shipped scenario, finalized as the runner does: "auto" filled by
zero_core's resolver as Hugging Face's Trainer fills it, for every engine, and accepted by zero_core."""

from __future__ import annotations

import glob
import os

import pytest

from helpers import REPO
from zbench import ds_config
from zbench.scenario import load_scenario
from zero_core import load_config
from zero_core.config_auto import is_auto

SCENARIOS = sorted(glob.glob(os.path.join(REPO, "scenarios", "*.yaml")))


def _autos(node, path=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _autos(v, f"{path}.{k}" if path else k)
    elif is_auto(node):
        yield path


@pytest.mark.parametrize("path", SCENARIOS, ids=os.path.basename)
def test_every_variant_config_is_filled_for_every_engine(path):
    sc = load_scenario(path)
    for v in sc.variants:
        template = ds_config.template(sc, v, os.path.dirname(path))
        filled = ds_config.finalize(template, sc=sc, batch=4, world_size=2, total_steps=40, hidden=64)
        # the offload ratio's "auto" is zero_core's own, chosen by the engine after a measured first step
        unfilled = [p for p in _autos(filled) if p != "zero_optimization.offload_optimizer.ratio"]
        assert unfilled == [], (v.name, unfilled)
        load_config(filled, 2)  # zero_core reads every engine's dict; ddp and fsdp2 take their optimizer from it
        params = (filled.get("scheduler") or {}).get("params") or {}
        if "warmup_num_steps" in params:
            # HF's Trainer (transformers >= 5.x) fills max(1, warmup_steps): DeepSpeed >= 0.19.6 refuses 0
            expected = max(1, sc.warmup_steps)
            raw = ((template.get("scheduler") or {}).get("params") or {}).get("warmup_num_steps")
            assert params["warmup_num_steps"] == (expected if is_auto(raw) else raw)


def test_warmup_zero_fills_one_as_hf_does():
    """gpt2xl_offload: warmup_steps 0 and warmup_num_steps "auto" (the row DeepSpeed refused with 0)."""
    path = os.path.join(REPO, "scenarios", "gpt2xl_offload.yaml")
    sc = load_scenario(path)
    ds_row = next(v for v in sc.variants if v.engine == "deepspeed")
    filled = ds_config.finalize(ds_config.template(sc, ds_row, os.path.dirname(path)), sc=sc, batch=16, world_size=1,
                                total_steps=40, hidden=1600)
    assert sc.warmup_steps == 0
    assert filled["scheduler"]["params"] == {"warmup_min_lr": 0.0, "warmup_max_lr": 5e-4, "warmup_num_steps": 1,
                                             "total_num_steps": 40}
