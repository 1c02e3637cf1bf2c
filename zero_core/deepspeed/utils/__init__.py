"""`deepspeed.utils`: `zero_to_fp32` (whole fp32 weights from a checkpoint after training), the per-parameter
reads `safe_get_full_fp32_param`, `safe_get_full_optimizer_state` and `safe_get_full_grad`, the writes
`safe_set_full_*`, their `safe_*_local_*` forms on this rank's share, `logger`/`log_dist` and `RepeatingLoader`."""

from ..runtime.dataloader import RepeatingLoader
from . import zero_to_fp32
from .logging import log_dist, logger, print_dist
from .tensor_fragment import (safe_get_full_fp32_param, safe_get_full_grad, safe_get_full_optimizer_state,
                              safe_get_local_fp32_param, safe_get_local_grad, safe_get_local_optimizer_state,
                              safe_set_full_fp32_param, safe_set_full_optimizer_state, safe_set_local_fp32_param,
                              safe_set_local_optimizer_state)

__all__ = ["zero_to_fp32", "safe_get_full_fp32_param", "safe_get_full_grad", "safe_get_full_optimizer_state",
           "safe_set_full_fp32_param", "safe_set_full_optimizer_state", "safe_get_local_fp32_param",
           "safe_get_local_grad", "safe_get_local_optimizer_state", "safe_set_local_fp32_param",
           "safe_set_local_optimizer_state", "logger", "log_dist", "print_dist", "RepeatingLoader"]
