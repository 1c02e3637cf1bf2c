"""docs/config.md's tables, printed from zero_core/config_auto.py and zero_core/config_keys.py (so they cannot drift).

    python tests/config_table.py            # print the block
    python tests/config_table.py --write    # replace the block in docs/config.md

`test_config_keys.py` fails when docs/config.md differs from what this prints.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from zero_core.config_auto import AUTO_RULES  # noqa: E402
from zero_core.config_keys import ALIASES, KEYS, SUPPORTED  # noqa: E402

from helpers import marked_block, rewrite_block  # noqa: E402

DOC = ROOT / "docs" / "config.md"
START, END = "<!-- config-table:start", "<!-- config-table:end -->"


def _auto_rows() -> list[str]:
    rows = ["| key | filled from | HF's rule | without a value |", "|---|---|---|---|"]
    for r in AUTO_RULES:
        source = " * ".join(r.fields) if r.key == "train_batch_size" else ", ".join(r.fields) or "–"
        rows.append(f"| `{r.key}` | {source} | {r.rule} | {r.without} |")
    return rows


def _key_rows() -> list[str]:
    rows = ["| key | zero_core | why |", "|---|---|---|"]
    supported: dict[str, list[str]] = {}  # section -> its supported keys, one row per section
    for k in KEYS:
        section, _, leaf = k.path.rpartition(".")
        if k.status == SUPPORTED:
            supported.setdefault(section, []).append(leaf)
    done = set()
    for k in KEYS:
        section, _, leaf = k.path.rpartition(".")
        if k.status != SUPPORTED:
            accepts = f" (accepted as {', '.join(json.dumps(v) for v in k.accepts)})" if k.accepts else ""
            rows.append(f"| `{k.path}` | {k.status}{accepts} | {k.why} |")
        elif section not in done:
            done.add(section)
            keys = ", ".join(f"`{name}`" for name in supported[section])
            rows.append(f"| {f'`{section}`: ' if section else 'top level: '}{keys} | supported | |")
    rows += [f"| `{old}` | alias | read as `{new}` |" for old, new in ALIASES.items()]
    return rows


def block() -> str:
    counts = Counter(k.status for k in KEYS)
    lines = [
        f"{START} (printed by `python tests/config_table.py` from zero_core's tables; a test keeps it current) -->",
        "",
        '### How "auto" is filled',
        "",
        *_auto_rows(),
        "",
        f"### Every key: {counts['supported']} supported, {counts['ignored']} ignored, {counts['refused']} refused",
        "",
        *_key_rows(),
        END,
    ]
    return "\n".join(lines)


def doc_block(text: str) -> str | None:
    return marked_block(text, START, END)


if __name__ == "__main__":
    new = block()
    if "--write" in sys.argv[1:]:
        rewrite_block(DOC, new, START, END)
    print(new)
