"""A rank entry point for launch tests: it raises the error a rank raises for bad input (module level: spawnable)."""

from zero_core import ConfigError


def raise_input_error(message: str) -> None:
    raise ConfigError(message)
