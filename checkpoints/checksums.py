"""File checksums of zbench checkpoints: which algorithm, how a manifest records it, how to check one.

A manifest's file entry is `{"bytes": n, "hash": "xxh3_128", "digest": hex}` (format 3), or
`{"bytes": n, "sha256": hex}` as formats 1-2 wrote it (still read). Writers hash the bytes as they go out
and readers as they come in (safetensors_stream.py, verified_read.py), so no pass reads a file only to
hash it. xxh3_128 (the `xxhash` package) hashes at memory speed; without it, sha256 is used.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any, Protocol


class Hasher(Protocol):
    def update(self, data: Any) -> None: ...

    def hexdigest(self) -> str: ...


def _xxh3() -> Hasher:
    import xxhash

    return xxhash.xxh3_128()


def _have_xxhash() -> bool:
    try:
        import xxhash  # noqa: F401
    except ImportError:
        return False
    return True


ALGORITHMS = {"xxh3_128": (_xxh3, 32), "sha256": (hashlib.sha256, 64)}  # name -> (new hasher, hex digits)
DEFAULT = "xxh3_128" if _have_xxhash() else "sha256"
_HEX = re.compile(r"[0-9a-f]+")


def new_hasher(algorithm: str) -> Hasher:
    if algorithm == "xxh3_128" and not _have_xxhash():
        raise ValueError("this checkpoint's files are checked with xxh3_128, which needs the xxhash package; "
                         "pip install xxhash")
    return ALGORITHMS[algorithm][0]()


def record(algorithm: str, hasher: Hasher, nbytes: int) -> dict[str, Any]:
    """The manifest entry of a file of `nbytes` whose bytes went through `hasher`."""
    return {"bytes": nbytes, "hash": algorithm, "digest": hasher.hexdigest()}


def expected(entry: dict[str, Any]) -> tuple[str, str]:
    """(algorithm, hex digest) a checked manifest file entry promises."""
    if "sha256" in entry:
        return "sha256", entry["sha256"]
    return entry["hash"], entry["digest"]


def entry_problem(entry: Any) -> str | None:
    """What is wrong with a file entry read from a manifest, or None."""
    if not isinstance(entry, dict) or not isinstance(entry.get("bytes"), int) or isinstance(entry["bytes"], bool) \
            or entry["bytes"] < 0:
        return "no byte count"
    if "sha256" in entry:
        algorithm, digest = "sha256", entry["sha256"]
    else:
        algorithm, digest = entry.get("hash"), entry.get("digest")
    if not isinstance(algorithm, str) or algorithm not in ALGORITHMS:
        return f"an unknown checksum algorithm {str(algorithm)[:20]!r}"
    if not (isinstance(digest, str) and len(digest) == ALGORITHMS[algorithm][1] and _HEX.fullmatch(digest)):
        return f"a malformed {algorithm} digest"
    return None


def file_digest(path: Path, algorithm: str | None = None) -> str:
    """Hash a file on disk (tools and tests; saves and loads hash in the same pass as their I/O)."""
    h = new_hasher(algorithm or DEFAULT)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def file_record(path: Path, algorithm: str | None = None) -> dict[str, Any]:
    algorithm = algorithm or DEFAULT
    return {"bytes": path.stat().st_size, "hash": algorithm, "digest": file_digest(path, algorithm)}
