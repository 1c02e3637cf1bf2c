"""The zero_optimization section and its offload sections take the keys and values DeepSpeed 0.19.8's config models
(runtime/zero/config.py, zero/offload_config.py) take, no more: a config DeepSpeed refuses there is refused in one
line naming the key and the fix, and one it takes loads. A config with several problems names them in one line,
numbered and set apart."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from config_helpers import MB, error

from zero_core import load_config
from zero_core.config_keys import ZERO_ALIASES
from zero_core.config_zero_models import OffloadOptimizerConfig, OffloadParamConfig, ZeroOptimizationConfig

EVERY_KEY = json.loads((Path(__file__).parent / "data" / "deepspeed_0.19.8_every_key.json").read_text())
# fields of DeepSpeedZeroConfig the every-key file leaves out: a default of None, or deprecated
NOT_IN_THE_FILE = {"overlap_comm", "cpu_offload", "cpu_offload_param"}


def test_no_key_of_the_zero_sections_is_one_deepspeed_refuses():
    zero = EVERY_KEY["zero_optimization"]
    assert set(ZeroOptimizationConfig.model_fields) - set(zero) - NOT_IN_THE_FILE == set()
    assert set(OffloadOptimizerConfig.model_fields) == set(zero["offload_optimizer"])
    assert set(OffloadParamConfig.model_fields) == set(zero["offload_param"])
    assert set(ZERO_ALIASES.values()) <= set(zero)


def test_aio_inside_zero_optimization_is_refused_with_the_fix():
    aio = {"block_size": 1048576, "queue_depth": 8}
    msg = error({**MB, "zero_optimization": {"stage": 3, "aio": aio}}, 1)
    assert msg == ("key 'zero_optimization.aio' is not supported by zero_core; move the 'aio' section to the top level "
                   "of the config, where DeepSpeed reads it (DeepSpeed refuses it inside zero_optimization too)")
    cfg = load_config({**MB, "zero_optimization": {"stage": 3}, "aio": aio}, 1)  # where it belongs, it is read
    assert cfg.aio.block_size == 1048576 and cfg.aio.queue_depth == 8


@pytest.mark.parametrize("stage, overlap", [(None, False), (2, False), (3, True)])
def test_overlap_comm_null_is_decided_by_the_stage(stage, overlap):
    zero = {"overlap_comm": None} if stage is None else {"stage": stage, "overlap_comm": None}
    assert load_config({**MB, "zero_optimization": zero}, 1).zero_optimization.overlap_comm is overlap


def test_an_empty_reduce_bucket_is_refused():
    msg = error({**MB, "zero_optimization": {"stage": 2, "reduce_bucket_size": 0}}, 1)
    assert msg == ("zero_optimization.reduce_bucket_size must be an integer >= 1 (5e8-style whole numbers are fine), "
                   "got 0; set it to an integer >= 1")


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_compute_grad_norm_false_only_at_stages_1_and_2(stage):
    config = {**MB, "zero_optimization": {"stage": stage, "compute_grad_norm": False}}
    if stage in (1, 2):
        load_config(config, 1)
        return
    assert error(config, 1) == (
        "zero_optimization.compute_grad_norm=false is allowed only at stages 1 and 2 (DeepSpeed refuses it too), "
        f"but zero_optimization.stage is {stage}; remove it or set true")


def test_several_problems_are_numbered_and_set_apart():
    msg = error({**MB, "zero_optimization": {"stgae": 2, "aio": {}}, "fp16": {"enabled": "yes"},
                 "amp": {}}, 1)
    head, _, rest = msg.partition(": ")
    assert head == "config has 4 problems"
    problems = rest.split(" | ")
    assert [re.match(r"\((\d)\) ", p).group(1) for p in problems] == ["1", "2", "3", "4"]
    assert all(p.count("; ") == 1 for p in problems)  # each: what is wrong; how to fix it
    assert problems[0] == "(1) fp16.enabled must be true or false, got 'yes'; write true or false"
    assert problems[1] == "(2) unknown key 'zero_optimization.stgae'; did you mean 'stage'?"
    assert problems[2].startswith("(3) key 'zero_optimization.aio' is not supported by zero_core; move the 'aio'")
    assert problems[3] == "(4) key 'amp' is not supported by zero_core; use 'fp16' or 'bf16' instead"
