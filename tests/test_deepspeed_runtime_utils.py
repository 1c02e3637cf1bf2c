"""`deepspeed.__version_major__` etc., `deepspeed.runtime.utils`'s helpers and `deepspeed.DeepSpeedConfig` answer as
DeepSpeed 0.19.8's (its answers recorded by tests/fixtures/make_deepspeed_small_utils.py), also through
`import deepspeed` under `python -m zero_core.deepspeed`."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy
import pytest
import torch

import zero_core.deepspeed as deepspeed
from helpers import fixture_script, repo_pythonpath
from zero_core.deepspeed.runtime import utils

FIXTURES = Path(__file__).resolve().parent / "fixtures"
REF = json.loads((FIXTURES / "deepspeed_small_utils.json").read_text())


def test_version_fields_are_deepspeeds_and_agree_with_version():
    assert [deepspeed.__version_major__, deepspeed.__version_minor__, deepspeed.__version_patch__,
            deepspeed.__git_hash__, deepspeed.__git_branch__] == REF["version"]
    assert deepspeed.__version__.startswith(f"{deepspeed.__version_major__}.{deepspeed.__version_minor__}."
                                            f"{deepspeed.__version_patch__}")


def test_call_to_str_and_get_global_norm_answer_as_deepspeed():
    assert [utils.call_to_str("f", 1, "a", k=2.0), utils.call_to_str("g"),
            utils.call_to_str("h", x=None, y=[1])] == REF["call_to_str"]
    got = [utils.get_global_norm(n) for n in ([3.0, 4.0], [torch.tensor(3.0), 4.0], [float("nan")], [-1.0], [])]
    assert got == REF["global_norm"]


@pytest.mark.parametrize("label,norm_type,max_norm", [("l2", 2, 1.0), ("inf", math.inf, 1.0), ("l1", 1, 100.0),
                                                      ("l3", 3, 2.0)])
def test_clip_grad_norm_gives_deepspeeds_norm_and_clipped_grads(label, norm_type, max_norm):
    p, q = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))
    p.grad, q.grad = torch.full((3,), 2.0), torch.tensor([1.0, -3.0])
    frozen = torch.nn.Parameter(torch.ones(2))  # no grad: left out, as DeepSpeed leaves it
    norm = utils.clip_grad_norm_([p, frozen, q], max_norm, norm_type=norm_type)
    want = REF["clip"][label]
    assert list(norm.shape) == want["shape"] and norm.dtype == torch.float32
    assert norm.item() == pytest.approx(want["norm"], rel=1e-6)
    assert p.grad.tolist() == pytest.approx(want["p"], rel=1e-6)
    assert q.grad.tolist() == pytest.approx(want["q"], rel=1e-6)


def test_move_to_device_recurses_and_moves_accepted_tensors_in_place():
    t, u = torch.ones(2), torch.zeros(1)
    moved = utils.move_to_device({"a": [t, (u,)]}, torch.float64, criterion_func=torch.is_tensor)
    assert moved["a"][0] is t and t.dtype == torch.float64  # accepted: the same tensor, its storage swapped
    assert isinstance(moved["a"], list) and isinstance(moved["a"][1], tuple) and moved["a"][1][0] is u
    v = torch.ones(2)
    copied = utils.move_to_device([v, (v,)], torch.float64)  # no criterion: each leaf's .to(), a new tensor
    assert copied[0] is not v and copied[0].dtype == torch.float64 and v.dtype == torch.float32
    assert isinstance(copied[1], tuple)
    with pytest.raises(AttributeError):  # a leaf without .to, as in DeepSpeed
        utils.move_to_device([torch.ones(1), 3], "cpu")


def test_set_random_seed_seeds_python_numpy_and_torch():
    seed = 2**70 + 5  # larger than numpy and torch take: reduced, as DeepSpeed reduces it
    utils.set_random_seed(seed)
    got = (random.random(), numpy.random.rand(), torch.rand(1).item())
    random.seed(seed)
    numpy.random.seed(seed % 2**32)
    torch.manual_seed(seed % 2**63)
    assert got == (random.random(), numpy.random.rand(), torch.rand(1).item())


def test_small_helpers(tmp_path):
    target = tmp_path / "a" / "b" / "file.txt"
    utils.ensure_directory_exists(str(target))
    assert target.parent.is_dir() and not target.exists()

    def f():
        return 1

    assert utils.noop_decorator(f) is f
    with utils.noop_context():
        pass
    utils.empty_cache()  # nothing to release on the CPU; must not fail


def test_deepspeed_config_answers_deepspeeds_values():
    maker = fixture_script("make_deepspeed_small_utils")  # its config and models (DeepSpeed only when run)
    config = deepspeed.DeepSpeedConfig(dict(maker.CONFIG))
    want = REF["config"]
    assert {name: getattr(config, name) for name in maker.CONFIG_READS} == {k: want[k] for k in maker.CONFIG_READS}
    assert [config.zero_config.stage, config.float16_config.enabled, config.bfloat16_config.enabled,
            config.timers_config.enabled, config.timers_config.synchronized] == [
        want["zero_stage"], want["fp16"], want["bf16"], *want["timers"]]
    assert deepspeed.runtime.config.DeepSpeedConfig is deepspeed.DeepSpeedConfig
    with pytest.raises(AttributeError, match="read-only"):
        config.train_batch_size = 12
    with pytest.raises(ValueError):  # zero_core's one-line refusal of a bad config, as at initialize
        deepspeed.DeepSpeedConfig({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 9}})


UNMODIFIED = """
import json, sys, torch
import deepspeed
lazy = "torch.utils.flop_counter" not in sys.modules  # the profiler loads on first use, not at import
by_attribute = deepspeed.profiling.flops_profiler.get_model_profile
from deepspeed.runtime.utils import move_to_device, clip_grad_norm_, call_to_str, set_random_seed
from deepspeed.utils.timer import SynchronizedWallClockTimer, ThroughputTimer
from deepspeed.profiling.flops_profiler import get_model_profile, FlopsProfiler
from deepspeed.runtime.config import DeepSpeedConfig
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 8))
print(json.dumps({"module": deepspeed.__name__, "patch": deepspeed.__version_patch__,
                  "call": call_to_str("f", 1), "profile": get_model_profile(model, input_shape=(4, 16),
                                                                            print_profile=False),
                  "stage": DeepSpeedConfig({"train_batch_size": 4}).zero_optimization_stage,
                  "lazy": lazy, "same": by_attribute is get_model_profile}))
"""


@pytest.mark.slow  # a fresh interpreter importing zero_core
def test_the_names_import_unmodified_under_the_launcher(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(UNMODIFIED)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    env.update(PYTHONPATH=repo_pythonpath(), CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, "-m", "zero_core.deepspeed", str(script)], capture_output=True, text=True,
                          env=env, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got == {"module": "zero_core.deepspeed", "patch": 8, "call": "f(1)",
                   "profile": REF["profiles"]["linear_chain"]["strings"], "stage": 0, "lazy": True, "same": True}
