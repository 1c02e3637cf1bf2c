"""`deepspeed.runtime.engine.DeepSpeedEngine`: what `initialize` returns, for scripts that check for it."""

from ...engine import Engine as DeepSpeedEngine

__all__ = ["DeepSpeedEngine"]
