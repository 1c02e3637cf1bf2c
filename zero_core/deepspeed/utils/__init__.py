"""`deepspeed.utils`: `zero_to_fp32` (whole fp32 weights from a checkpoint after training), the per-parameter reads
`safe_get_full_fp32_param`, `safe_get_full_optimizer_state` and `safe_get_full_grad`, the writes `safe_set_full_*`,
their `safe_*_local_*` forms on this rank's share, `logger`/`log_dist`/`print_json_dist`, `instrument_w_nvtx`,
`RepeatingLoader`, `OnDevice`, the ZeRO-3 leaf-module marks (z3_leaf_module.py), `groups` (the data-parallel
group's size and rank) and `timer` (`SynchronizedWallClockTimer`, `ThroughputTimer`)."""

from ..runtime.dataloader import RepeatingLoader
from . import groups, nvtx, timer, zero_to_fp32
from .init_on_device import OnDevice
from .logging import log_dist, logger, print_dist, print_json_dist
from .nvtx import instrument_w_nvtx
from .tensor_fragment import (safe_get_full_fp32_param, safe_get_full_grad, safe_get_full_optimizer_state,
                              safe_get_local_fp32_param, safe_get_local_grad, safe_get_local_optimizer_state,
                              safe_set_full_fp32_param, safe_set_full_optimizer_state, safe_set_local_fp32_param,
                              safe_set_local_optimizer_state)
from .z3_leaf_module import (get_z3_leaf_modules, set_z3_leaf_module, set_z3_leaf_modules,
                             set_z3_leaf_modules_by_name, set_z3_leaf_modules_by_suffix, unset_z3_leaf_modules,
                             z3_leaf_module, z3_leaf_parameter)

__all__ = ["groups", "nvtx", "timer", "zero_to_fp32", "instrument_w_nvtx", "print_json_dist",
           "safe_get_full_fp32_param", "safe_get_full_grad",
           "safe_get_full_optimizer_state", "safe_set_full_fp32_param", "safe_set_full_optimizer_state",
           "safe_get_local_fp32_param", "safe_get_local_grad", "safe_get_local_optimizer_state",
           "safe_set_local_fp32_param", "safe_set_local_optimizer_state", "logger", "log_dist", "print_dist",
           "RepeatingLoader", "OnDevice", "get_z3_leaf_modules", "set_z3_leaf_module", "set_z3_leaf_modules",
           "set_z3_leaf_modules_by_name", "set_z3_leaf_modules_by_suffix", "unset_z3_leaf_modules", "z3_leaf_module",
           "z3_leaf_parameter"]
