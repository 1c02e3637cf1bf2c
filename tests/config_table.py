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
from zero_core.config_keys import ALIASES, KEYS, SUPPORTED, Key  # noqa: E402

from helpers import marked_block, rewrite_block  # noqa: E402

DOC = ROOT / "docs" / "config.md"
START, END = "<!-- config-table:start", "<!-- config-table:end -->"


def _auto_rows() -> list[str]:
    rows = ["| key | filled from | HF's rule | without a value |", "|---|---|---|---|"]
    for r in AUTO_RULES:
        source = " * ".join(r.fields) if r.key == "train_batch_size" else ", ".join(r.fields) or "–"
        rows.append(f"| `{r.key}` | {source} | {r.rule} | {r.without} |")
    return rows


def _status(k: Key) -> str:
    if k.switch:
        return f"{k.status} (accepted while `{k.switch}` is {' or '.join(json.dumps(v) for v in k.accepts)})"
    accepts = f" (accepted as {', '.join(json.dumps(v) for v in k.accepts)})" if k.accepts else ""
    return k.status + accepts


def _key_rows() -> list[str]:
    """One row per section's supported keys (where the section first appears), one per set of keys of a section
    that zero_core treats alike (status, accepted values and reason, such as what a supported key writes), and one
    per alias target section."""
    rows = ["| key | zero_core | why |", "|---|---|---|"]
    supported: dict[tuple[str, ...], list[str]] = {}  # (section,) -> its supported keys
    alike: dict[tuple[str, str, str], list[str]] = {}  # (section, status, why) -> its keys, one row each
    order: list[tuple[str, ...]] = []
    for k in KEYS:
        section, _, leaf = k.path.rpartition(".")
        together = k.status == SUPPORTED and not k.why  # a supported key that says what it does gets its own row
        group = (section,) if together else (section, _status(k), k.why)
        found = supported if together else alike
        if group not in found:
            found[group] = []
            order.append(group)
        found[group].append(leaf)
    for group in order:
        section = group[0]
        if len(group) == 1:
            keys = ", ".join(f"`{name}`" for name in supported[group])
            rows.append(f"| {f'`{section}`: ' if section else 'top level: '}{keys} | supported | |")
        else:
            keys = ", ".join(f"`{name}`" for name in alike[group])
            rows.append(f"| {f'`{section}`: ' if section else ''}{keys} | {group[1]} | {group[2]} |")
    prefixed = [old for old, new in ALIASES.items() if new == old.replace(".", ".stage3_", 1)]  # DeepSpeed's own names
    by_target: dict[str, list[str]] = {}
    for old, new in ALIASES.items():
        if old not in prefixed:
            by_target.setdefault(new, []).append(old)
    rows += [f"| {', '.join(f'`{o}`' for o in olds)} | alias | read as `{new}` |" for new, olds in by_target.items()]
    leaves = ", ".join(f"`{old.partition('.')[2]}`" for old in prefixed)
    rows.append(f"| `zero_optimization`: {leaves} | alias | read as the same key with `stage3_` in front |")
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
