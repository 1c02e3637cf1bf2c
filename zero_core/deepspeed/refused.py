"""Names of DeepSpeed's modules that zero_core deliberately lacks, refused in one line that says what to do.

`from deepspeed.x import Name` turns an AttributeError into a bare "cannot import name" traceback, so a refused
name raises ModuleNotFoundError (an ImportError, what the import would raise anyway), which the refusal hook
prints as its one `Error:` line. Any other missing name stays an AttributeError, as `hasattr` expects."""

from __future__ import annotations

from typing import Any, Callable


def not_provided(qualified: str, reason: str) -> ModuleNotFoundError:
    """The one-line refusal of DeepSpeed's `qualified` name (its `deepspeed.` path)."""
    return ModuleNotFoundError(f"{qualified} is not provided by zero_core: {reason}", name=qualified)


def refusing_getattr(module_name: str, refusals: dict[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` refusing the names in `refusals` (name -> what to do instead)."""
    public = module_name.removeprefix("zero_core.")

    def __getattr__(name: str) -> Any:
        if name in refusals:
            raise not_provided(f"{public}.{name}", refusals[name])
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}")

    return __getattr__
