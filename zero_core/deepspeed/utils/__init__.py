"""`deepspeed.utils`: `zero_to_fp32`, the functions scripts call after training to get whole fp32 weights."""

from . import zero_to_fp32

__all__ = ["zero_to_fp32"]
