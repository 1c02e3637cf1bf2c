"""Offload that cannot get its host memory fails at initialize with one clear line."""

from __future__ import annotations

import pytest
import torch

import zero_core
from zero_core import comm
from parity_workers import ds_config, make_model


def test_unallocatable_host_buffer_is_one_clear_error(monkeypatch):
    real_zeros = torch.zeros

    def failing_zeros(*args, **kwargs):
        if "pin_memory" in kwargs:  # only the offload buffers ask for (maybe) pinned memory
            raise RuntimeError("CUDA error: out of memory\nmore driver text")
        return real_zeros(*args, **kwargs)

    monkeypatch.setattr(comm.torch, "zeros", failing_zeros)
    cfg = ds_config(2, "fp32", 2, offload_optimizer={"device": "cpu"})
    with pytest.raises(MemoryError) as e:
        zero_core.initialize(make_model(), cfg)
    msg = str(e.value)
    assert "\n" not in msg and "host memory for offload" in msg and "turn offload off" in msg
