"""`deepspeed.profiling`: the flops profiler (`flops_profiler.get_model_profile`, `flops_profiler.FlopsProfiler`),
counted with torch's FlopCounterMode (flops_profiler/profiler.py says where its counts differ from DeepSpeed's)."""

from . import flops_profiler

__all__ = ["flops_profiler"]
