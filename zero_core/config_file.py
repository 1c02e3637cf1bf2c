"""Read a DeepSpeed-style JSON config file as plain data, refusing in one ConfigError line what json.load would
take silently (duplicate keys) or what is no config at all (a FIFO, an oversized file, a path with a NUL byte)."""

from __future__ import annotations

import json
from typing import Any

from checkpoints.paths import NotRegularFile, read_regular

from .config_errors import ConfigError

MAX_CONFIG_BYTES = 16 << 20  # a DeepSpeed config is a few kB; a file this size is something else


def read_config_file(path: str) -> Any:
    """Parse a DeepSpeed-style JSON file, refusing duplicate keys (json.load silently keeps the last)."""

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise ConfigError(f"config file '{path}' has the key '{key}' twice in one object; keep one")
            out[key] = value
        return out

    if "\0" in path:  # open() would raise a bare ValueError
        raise ConfigError(f"config path {path!r} contains a NUL byte; pass the path of a DeepSpeed-style JSON file")
    try:
        raw = read_regular(path, MAX_CONFIG_BYTES)  # a FIFO is refused, never waited on
        if len(raw) > MAX_CONFIG_BYTES:
            raise ConfigError(f"config file '{path}' is larger than {MAX_CONFIG_BYTES} bytes, far more than any "
                              "DeepSpeed config; pass the config file itself")
        return json.loads(raw.decode("utf-8"), object_pairs_hook=no_duplicates)
    except ConfigError:
        raise
    except NotRegularFile:
        raise ConfigError(f"config file '{path}' is not a regular file; pass a DeepSpeed-style JSON file") from None
    except FileNotFoundError:
        raise ConfigError(
            f"config file '{path}' does not exist; pass the path of a DeepSpeed-style JSON file"
        ) from None
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"config file '{path}' is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}; "
            "fix the syntax (double quotes, no trailing commas, no comments)"
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config file '{path}': {e}; pass a readable UTF-8 JSON file") from None
    except (RecursionError, ValueError) as e:  # nesting past Python's stack; an integer of over 4300 digits
        what = "nested too deeply" if isinstance(e, RecursionError) else "holds a number too long to read"
        raise ConfigError(f"config file '{path}' {what}; pass a DeepSpeed-style JSON config") from None
