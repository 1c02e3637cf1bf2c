"""The stream transforms (DCP's `_extensions`, e.g. ZStandard compression) a DCP folder's chunks were written through.

DCP records them per chunk as descriptors (`stream.zstd/1`) and decodes them with optional packages: ZStandard
needs `zstandard` or `pyzstd`. A folder that needs one this machine lacks is not damaged, so it is refused up
front with the package to install, rather than reported as an unreadable file when its first chunk is read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .source import CheckpointError

# the packages each transform DCP knows reads with (torch.distributed.checkpoint._extension)
PACKAGES = {"stream.zstd": "zstandard"}


def descriptors_of(metadata: Any) -> list[str]:
    """Every distinct transform descriptor named by the folder's storage entries, in first-seen order."""
    seen: dict[str, None] = {}
    for info in metadata.storage_data.values():
        for desc in getattr(info, "transform_descriptors", None) or ():
            seen.setdefault(desc if isinstance(desc, str) else repr(desc)[:60], None)
    return list(seen)


def check_extensions(folder: Path, metadata: Any) -> None:
    """One line naming what to install (or that this torch cannot decode them) when a chunk's transforms cannot
    be applied here; nothing when every chunk is plain or decodable."""
    descriptors = descriptors_of(metadata)
    if not descriptors:
        return
    try:
        from torch.distributed.checkpoint._extension import ExtensionRegistry
    except ImportError:
        raise CheckpointError(
            f"{folder}: its chunks were written through DCP extensions ({', '.join(descriptors[:3])}) that this torch "
            "cannot read; convert it with the torch version that saved it"
        ) from None
    registry = ExtensionRegistry()
    for desc in descriptors:
        name = desc.partition("/")[0]
        if name not in registry.extensions:
            raise CheckpointError(
                f"{folder}: its chunks were written through the DCP extension {desc!r}, which this torch does not "
                "know; convert it with the torch version (and extension) that saved it"
            )
        try:
            registry.from_descriptor_list([desc])
        except (ValueError, ImportError) as e:
            package = PACKAGES.get(name)
            missing = package is not None and "module" in str(e)  # torch names the absent package
            fix = (f"install it: pip install {package}" if missing
                   else "convert it with the torch version that saved it")
            raise CheckpointError(
                f"{folder}: its chunks were written through the DCP extension {desc!r}, which this machine cannot "
                f"decode ({(str(e).splitlines() or [type(e).__name__])[0][:100]}); {fix}"
            ) from None
