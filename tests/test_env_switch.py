"""The engine's on/off environment switches read one set of words (zero_core/env_switch.py); the breakdown's
switch overrides its default both ways."""

from __future__ import annotations

import pytest

from zero_core.env_switch import env_switch
from zero_core.step_timer import enabled_for


@pytest.mark.parametrize("value, want", [
    ("0", False), ("off", False), (" False ", False), ("NO", False),
    ("1", True), ("on", True), ("Yes", True), ("true", True),
    ("auto", None), ("", None), ("2", None), ("maybe", None),
])
def test_env_switch_words(monkeypatch, value, want):
    monkeypatch.setenv("ZERO_CORE_TEST_SWITCH", value)
    assert env_switch("ZERO_CORE_TEST_SWITCH") is want


def test_an_unset_switch_is_auto(monkeypatch):
    monkeypatch.delenv("ZERO_CORE_TEST_SWITCH", raising=False)
    assert env_switch("ZERO_CORE_TEST_SWITCH") is None


@pytest.mark.parametrize("value, offload, want", [
    (None, True, True), (None, False, False),  # auto: on with offload
    ("off", True, False), ("on", False, True),
])
def test_breakdown_switch_overrides_its_default(monkeypatch, value, offload, want):
    if value is None:
        monkeypatch.delenv("ZERO_CORE_BREAKDOWN", raising=False)
    else:
        monkeypatch.setenv("ZERO_CORE_BREAKDOWN", value)
    assert enabled_for(offload) is want
