"""`deepspeed.ops`: the Adam classes scripts build before initialize (zero_core runs them on its own kernels)."""

from . import adam

__all__ = ["adam"]
