"""`deepspeed.runtime.zero` (of which `deepspeed.zero` is DeepSpeed's short name): `Init` and
`GatheredParameters`, also under `partition_parameters`, and the model-state memory estimators of `stage3` and
`stage_1_and_2`."""

from ...zero import GatheredParameters, Init
from . import partition_parameters, stage3, stage_1_and_2

__all__ = ["GatheredParameters", "Init", "partition_parameters", "stage3", "stage_1_and_2"]
