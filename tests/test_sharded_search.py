"""Model search at stage 3 builds each candidate sharded: a 45 B candidate costs the host nothing to build."""

from __future__ import annotations

import contextlib
import os

import torch

from helpers import REPO, table, tiny_scenario, zbench
from zero_core import memory_estimate as est
from zbench.host_memory import rss_bytes
from zbench.models.configs import load_arch
from zbench.models.factory import build_model
from zbench.worker import _sharded_init
import pytest

pytestmark = pytest.mark.slow  # spawned ranks or whole runs: outside the fast tier (-m 'not slow')


def test_stage3_candidate_of_45b_is_built_without_memory():
    arch = load_arch("mingpt-1.7b", str(REPO / "scenarios"), {"n_layer": 56, "n_embd": 8192})
    job = {"engine": "zero", "ds": {"zero_optimization": {"stage": 3}}, "mode": "probe"}
    torch.manual_seed(0)
    before = rss_bytes()
    with _sharded_init(job, None):
        bundle = build_model(task="lm", arch=arch, pretrained=None)
    assert bundle.n_params > 45e9
    assert all(p.device.type == "meta" for p in bundle.model.parameters())
    assert rss_bytes() - before < 200 << 20  # the record, not 180 GB of weights
    eager, sharded = est.init_bytes(bundle.n_params, bundle.largest_layer, 1)
    assert eager == 4 * bundle.n_params and sharded < eager / 50


def test_other_engines_build_eagerly():
    for job in ({"engine": "ddp", "ds": None, "mode": "probe"},
                {"engine": "zero", "ds": {"zero_optimization": {"stage": 2}}, "mode": "probe"},
                {"engine": "zero", "ds": {"zero_optimization": {"stage": 3}}, "mode": "floor"}):
        assert isinstance(_sharded_init(job, None), contextlib.nullcontext)


def test_model_search_at_stage_3_runs(tmp_path):
    variants = [{"name": "z3", "engine": "zero", "stage": 3}]
    path = tiny_scenario(tmp_path, "search", variants, model_search={"key": "n_layer", "values": [1, 2]}, steps=2)
    result = zbench("run", path, "--out", str(tmp_path / "out"), env={"PYTHONPATH": os.getcwd()})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "z3" in table(result.stdout)


def test_estimate_prints_initialisation_memory():
    result = zbench("estimate", "--model", "mingpt-45b")
    assert result.returncode == 0, result.stderr
    assert "eager construction (every rank builds the fp32 model)" in result.stdout
    assert "zero_core.init_context / zero.Init, stage 3" in result.stdout
