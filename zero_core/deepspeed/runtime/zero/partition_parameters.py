"""`deepspeed.runtime.zero.partition_parameters`: where DeepSpeed defines `Init` and `GatheredParameters`."""

from ...zero import GatheredParameters, Init

__all__ = ["GatheredParameters", "Init"]
