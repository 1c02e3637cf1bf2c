"""Arrow and Parquet files as plain columns, with pyarrow only (the `datasets` library is not needed).

Hugging Face `datasets` writes its cache and `save_to_disk` folders as Arrow IPC *stream* files
(`glue-train.arrow`, `data-00000-of-00001.arrow`); the Hub keeps datasets as Parquet
(`mrpc/train-00000-of-00001.parquet`). The format is told by the file's first bytes, not its name.
"""

from __future__ import annotations

from typing import Any

from zero_core import ConfigError

PARQUET_MAGIC = b"PAR1"
ARROW_FILE_MAGIC = b"ARROW1"


def require_pyarrow(what: str) -> Any:
    try:
        import pyarrow
    except ImportError:
        raise ConfigError(f"{what} needs pyarrow, which is not installed here; pip install pyarrow "
                          "(or pip install 'zbench[data]')") from None
    return pyarrow


def _kind(path: str) -> str:
    with open(path, "rb") as f:
        return "parquet" if f.read(4) == PARQUET_MAGIC else "arrow"


def _read(path: str, what: str, columns: list[str] | None) -> Any:
    """The schema (columns None) or a table of the named columns."""
    pa = require_pyarrow(what)
    try:
        if _kind(path) == "parquet":
            import pyarrow.parquet as pq

            return pq.read_schema(path) if columns is None else pq.read_table(path, columns=columns)
        with pa.memory_map(path) as source:
            head = source.read(8)
            source.seek(0)
            reader = pa.ipc.open_file(source) if head.startswith(ARROW_FILE_MAGIC) else pa.ipc.open_stream(source)
            return reader.schema if columns is None else reader.read_all().select(columns)
    except (pa.ArrowInvalid, OSError) as e:
        raise ConfigError(f"{what}: {path} is not a readable Arrow or Parquet file ({e}); copy it again") from None


def read_schema_names(path: str, what: str) -> list[str]:
    """Column names of an Arrow (stream or file) or Parquet file, reading only its schema."""
    return list(_read(path, what, None).names)


def read_columns(path: str, columns: list[str], what: str) -> dict[str, list[Any]]:
    """The named columns (present: check with read_schema_names) as Python lists."""
    table = _read(path, what, columns)
    return {c: table.column(c).to_pylist() for c in columns}
