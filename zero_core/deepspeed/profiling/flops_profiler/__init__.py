"""`deepspeed.profiling.flops_profiler`: `get_model_profile`, `FlopsProfiler` and the number formats (profiler.py)."""

from .profiler import FlopsProfiler, get_model_profile
from .report import (bytes_to_string, duration_to_string, flops_to_string, get_module_duration, get_module_flops,
                     get_module_macs, macs_to_string, number_to_string, params_to_string)

__all__ = ["FlopsProfiler", "get_model_profile", "bytes_to_string", "duration_to_string", "flops_to_string",
           "get_module_duration", "get_module_flops", "get_module_macs", "macs_to_string", "number_to_string",
           "params_to_string"]
