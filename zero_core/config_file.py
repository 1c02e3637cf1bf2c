"""Read a DeepSpeed-style JSON config file as plain data, with hjson as DeepSpeed reads it (so comments, trailing
commas and the rest of Hjson load as they do there), refusing in one ConfigError line what DeepSpeed would also
refuse (duplicate keys) or what is no config at all (a FIFO, an oversized file, a path with a NUL byte)."""

from __future__ import annotations

import json
import os
import re
from typing import Any, Callable

import hjson

from checkpoints.paths import NotRegularFile, read_regular

from .config_errors import ConfigError

MAX_CONFIG_BYTES = 16 << 20  # a DeepSpeed config is a few kB; a file this size is something else


def read_config_file(path: str) -> Any:
    """Parse a DeepSpeed-style config file as DeepSpeed does (hjson: JSON with comments and trailing commas, among
    others), refusing duplicate keys as DeepSpeed's reader does."""
    return _read(path, lambda text, hook: hjson.loads(text, object_pairs_hook=hook))


def config_data(config: Any) -> Any:
    """A config given as data or as the path of a file: the data (a path is read as read_config_file reads it)."""
    return read_config_file(os.fspath(config)) if isinstance(config, (str, os.PathLike)) else config


def read_json_file(path: str) -> Any:
    """The same checks for a file of zbench's own that is strict JSON (a model config), read by json."""
    return _read(path, lambda text, hook: json.loads(text, object_pairs_hook=hook))


def _read(path: str, parse: Callable[[str, Callable], Any]) -> Any:
    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise ConfigError(f"config file '{path}' has the key '{key}' twice in one object; keep one")
            out[key] = value
        return out

    if "\0" in path:  # open() would raise a bare ValueError
        raise ConfigError(f"config path {path!r} contains a NUL byte; pass the path of a DeepSpeed-style JSON file")
    text = ""
    try:
        raw = read_regular(path, MAX_CONFIG_BYTES)  # a FIFO is refused, never waited on
        if len(raw) > MAX_CONFIG_BYTES:
            raise ConfigError(f"config file '{path}' is larger than {MAX_CONFIG_BYTES} bytes, far more than any "
                              "DeepSpeed config; pass the config file itself")
        text = raw.decode("utf-8")
        if not text.strip():  # hjson reads nothing as an empty object
            raise ConfigError(f"config file '{path}' is not valid JSON: it is empty; pass a DeepSpeed-style config")
        return parse(text, no_duplicates)
    except ConfigError:
        raise
    except NotRegularFile:
        raise ConfigError(f"config file '{path}' is not a regular file; pass a DeepSpeed-style JSON file") from None
    except FileNotFoundError:
        raise ConfigError(
            f"config file '{path}' does not exist; pass the path of a DeepSpeed-style JSON file"
        ) from None
    except (json.JSONDecodeError, hjson.HjsonDecodeError) as e:
        if re.search(r"(?<![\w\"])-?(NaN|Infinity)(?![\w\"])", text):
            raise ConfigError(f"config file '{path}' holds NaN or Infinity, which are no JSON numbers (DeepSpeed's "
                              "reader refuses them too); write a finite number") from None
        raise ConfigError(
            f"config file '{path}' is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}; "
            "fix the syntax (keys and strings in double quotes, values separated by commas)"
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config file '{path}': {e}; pass a readable UTF-8 JSON file") from None
    except (RecursionError, ValueError, OverflowError) as e:  # nesting past Python's stack; a number past reading
        what = "nested too deeply" if isinstance(e, RecursionError) else "holds a number too long to read"
        raise ConfigError(f"config file '{path}' {what}; pass a DeepSpeed-style JSON config") from None
