"""Offload that cannot get its host memory fails at initialize with one clear line."""

from __future__ import annotations

import pytest

import zero_core
from zero_core import comm
from parity_workers import ds_config, make_model


def test_unallocatable_host_buffer_is_one_clear_error(monkeypatch):
    def failing_allocation(numel, dtype):  # what torch raises when the host has no room (here, with driver text)
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory\nmore allocator text")

    monkeypatch.setattr(comm, "empty_host", failing_allocation)  # every unpinned offload buffer comes from here
    cfg = ds_config(2, "fp32", 2, offload_optimizer={"device": "cpu"})
    with pytest.raises(MemoryError) as e:
        zero_core.initialize(make_model(), cfg)
    msg = str(e.value)
    assert "\n" not in msg and "host memory for offload" in msg and "turn offload off" in msg
