"""The host's memory as the kernel reports it (/proc/meminfo), in bytes."""

from __future__ import annotations


def meminfo_bytes() -> dict[str, int]:
    """Every /proc/meminfo field in bytes ({} where the file cannot be read: not Linux)."""
    fields: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                name, _, rest = line.partition(":")
                value = rest.split()
                if value and value[0].isdigit():
                    fields[name] = int(value[0]) * (1024 if value[1:] == ["kB"] else 1)
    except OSError:
        return {}
    return fields
