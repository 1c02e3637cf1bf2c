"""Collectives on tensors the backend cannot reach: NCCL sees only GPU memory, so a host tensor (the random state
a stage-3 model's construction is replayed from) goes through this rank's GPU and back."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from zero_core import comm


@pytest.mark.parametrize("backend,device,want", [
    ("nccl", "cpu", False), ("nccl", "cuda", True), ("gloo", "cpu", True), ("gloo", "cuda", True),
    ("cpu:gloo,cuda:nccl", "cpu", True), ("cpu:gloo,cuda:nccl", "cuda", True), ("cuda:nccl", "cpu", False),
])
def test_which_devices_a_backend_reaches(monkeypatch, backend, device, want):
    monkeypatch.setattr(dist, "get_backend", lambda *a: backend)
    assert comm.reaches(torch.device(device)) is want


def _fake_world(monkeypatch, backend: str, rank0_value: torch.Tensor) -> list[torch.Tensor]:
    """Two ranks on `backend`, seen from rank 1: a broadcast writes rank 0's value into what it is given."""
    sent: list[torch.Tensor] = []

    def broadcast(t, src):
        sent.append(t)
        t.copy_(rank0_value)

    monkeypatch.setattr(comm, "world_size", lambda: 2)
    monkeypatch.setattr(dist, "get_backend", lambda *a: backend)
    monkeypatch.setattr(dist, "broadcast", broadcast)
    return sent


def test_a_host_tensor_broadcast_over_nccl_goes_through_the_gpu(monkeypatch):
    rank0 = torch.get_rng_state()
    mine = torch.zeros_like(rank0)
    sent = _fake_world(monkeypatch, "nccl", rank0)
    hops: list[torch.Tensor] = []

    def to_gpu(t):  # stands in for the GPU copy: a tensor of its own, as t.to("cuda") gives
        hops.append(t.clone())
        return hops[-1]

    monkeypatch.setattr(comm, "hop_device", lambda: "hop")
    monkeypatch.setattr(torch.Tensor, "to", lambda t, device, *a, **k: to_gpu(t) if device == "hop" else t)
    comm.broadcast_(mine, what="broadcast of a random state")
    assert len(sent) == 1 and sent[0] is hops[0] and sent[0] is not mine  # the collective saw the GPU copy
    assert torch.equal(mine, rank0)  # ... and rank 0's value came back into the host tensor


def test_a_tensor_the_backend_reaches_is_broadcast_in_place(monkeypatch):
    rank0 = torch.arange(4.0)
    mine = torch.zeros(4)
    sent = _fake_world(monkeypatch, "gloo", rank0)
    comm.broadcast_(mine)
    assert len(sent) == 1 and sent[0] is mine and torch.equal(mine, rank0)
