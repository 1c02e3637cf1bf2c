"""`deepspeed.runtime.zero` (of which `deepspeed.zero` is DeepSpeed's short name): `Init`, `GatheredParameters` and
`ZeroParamStatus`, also under `partition_parameters`, and the model-state memory estimators of `stage3` and
`stage_1_and_2`."""

from ...zero import GatheredParameters, Init, register_external_parameter
from . import partition_parameters, stage3, stage_1_and_2
from .partition_parameters import ZeroParamStatus, ZeroParamType

__all__ = ["GatheredParameters", "Init", "ZeroParamStatus", "ZeroParamType", "partition_parameters",
           "register_external_parameter", "stage3", "stage_1_and_2"]
