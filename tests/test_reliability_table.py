"""The reliability tables (README.md's summary, docs/reliability.md's details) are what the battery's case
lists count (tests/reliability.py prints them)."""

from __future__ import annotations

import reliability


def test_every_test_the_table_counts_exists():
    for _, ref, _, _ in reliability.FAULTS:
        assert reliability.cases(ref) >= 1, ref
    for ref in reliability.FUZZ:
        assert reliability.examples(ref) >= 1, ref


def test_readme_table_matches_the_battery():
    text = reliability.README.read_text(encoding="utf-8")
    assert reliability.block_in(text) == reliability.summary(), "run `python tests/reliability.py --write`"


def test_reliability_page_tables_match_the_battery():
    text = reliability.PAGE.read_text(encoding="utf-8")
    assert reliability.block_in(text) == reliability.details(), "run `python tests/reliability.py --write`"
