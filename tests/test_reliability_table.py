"""README's reliability table is what the battery's case lists count (tests/reliability.py prints it)."""

from __future__ import annotations

import reliability


def test_every_test_the_table_counts_exists():
    for _, ref, _, _ in reliability.FAULTS:
        assert reliability.cases(ref) >= 1, ref
    for ref in reliability.FUZZ:
        assert reliability.examples(ref) >= 1, ref


def test_readme_table_matches_the_battery():
    text = reliability.README.read_text(encoding="utf-8")
    assert reliability.readme_block(text) == reliability.block(), "run `python tests/reliability.py --write`"
