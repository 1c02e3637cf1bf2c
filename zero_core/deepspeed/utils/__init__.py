"""`deepspeed.utils`: `zero_to_fp32` (whole fp32 weights from a checkpoint after training) and the per-parameter
reads `safe_get_full_fp32_param` and `safe_get_full_optimizer_state`."""

from . import zero_to_fp32
from .tensor_fragment import safe_get_full_fp32_param, safe_get_full_optimizer_state

__all__ = ["zero_to_fp32", "safe_get_full_fp32_param", "safe_get_full_optimizer_state"]
