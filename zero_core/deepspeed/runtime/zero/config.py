"""`deepspeed.runtime.zero.config.ZeroStageEnum`: the ZeRO stages by name, for scripts that compare a config's
stage against them (an int enum: `ZeroStageEnum.weights == 3`)."""

from __future__ import annotations

from enum import Enum

from ...refused import refusing_getattr


class ZeroStageEnum(int, Enum):
    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3
    max_stage = 3  # an alias of weights, as in DeepSpeed


__getattr__ = refusing_getattr(__name__, {
    "DeepSpeedZeroConfig": "zero_core parses the zero_optimization section itself; read it from "
                           "deepspeed.DeepSpeedConfig(config).zero_config or engine._config.zero_config"})
