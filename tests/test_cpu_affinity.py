"""Per-rank CPU sets for offloaded runs (zero_core/optim/affinity.py): disjoint whole cores, and no failure
where pinning is refused."""

from __future__ import annotations

import pytest
import torch

from zero_core.optim import affinity

def _smt(n_cores: int, sockets: int = 1):
    """n_cores physical cores with 2 hyper-threads each, Linux numbering (siblings n_cores apart)."""
    per_socket = n_cores // sockets
    return list(range(2 * n_cores)), lambda cpu: ((cpu % n_cores) // per_socket, cpu % n_cores)


@pytest.mark.parametrize("n_cores, sockets, ranks", [(16, 2, 2), (8, 1, 3), (7, 1, 2), (4, 1, 4), (64, 2, 8)])
def test_split_cpus_gives_disjoint_whole_core_sets(n_cores, sockets, ranks):
    cpus, core_of = _smt(n_cores, sockets)
    sets = [affinity.split_cpus(cpus, r, ranks, core_of) for r in range(ranks)]
    flat = [c for s in sets for c in s]
    assert len(flat) == len(set(flat)) and sorted(flat) == cpus  # disjoint, and nothing left idle
    for s in sets:
        assert {core_of(c) for c in s} == {core_of(c) for c in s if c < n_cores}  # siblings stay together
        assert len({core_of(c)[0] for c in s}) == 1 or ranks < sockets  # one socket per rank where counts allow
    sizes = [len(s) for s in sets]
    assert max(sizes) - min(sizes) <= 2


def test_split_cpus_refuses_when_ranks_outnumber_cores_and_uses_only_allowed_cpus():
    assert affinity.split_cpus([0, 1], 0, 4, lambda c: (0, c)) == []
    allowed = [2, 3, 5, 8]  # e.g. a cgroup cpuset
    sets = [affinity.split_cpus(allowed, r, 2, lambda c: (0, c)) for r in range(2)]
    assert sets == [[2, 3], [5, 8]]


def test_pinning_switch_and_no_failure(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv(affinity.ENV, "0")
    assert affinity.pin_rank(offload=True) is None
    monkeypatch.setenv(affinity.ENV, "auto")
    assert affinity.pin_rank(offload=False) is None  # auto pins only offloaded runs

    def refuse(*a):
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(affinity.os, "sched_setaffinity", refuse)
    threads = torch.get_num_threads()
    assert affinity.pin_rank(offload=True) is None and torch.get_num_threads() == threads
    assert affinity.describe([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


@pytest.mark.parametrize("cores, on_gpu, omp, want", [
    (16, True, "", 15),  # the training thread keeps one core: the host team takes the rest
    (16, False, "", 16),  # CPU training or no offload: the whole pool
    (1, True, "", 1),  # never an empty team
    (16, True, "12", 12), (16, True, "32", 16), (8, True, " 4 ", 4),  # an explicit OMP_NUM_THREADS, within the cores
    (16, True, "0", 15), (16, True, "many", 15),  # not a positive count: ignored
])
def test_team_size_leaves_the_training_thread_a_core_with_offload_on_a_gpu(cores, on_gpu, omp, want):
    assert affinity.team_size(cores, on_gpu, omp) == want


def test_size_team_sizes_torchs_pool_from_the_pinned_cores(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(affinity, "_sized", None)
    try:
        assert affinity.size_team([0, 1, 2], offload_on_gpu=True) == 2 and torch.get_num_threads() == 2
        assert affinity.size_team([0, 1, 2], offload_on_gpu=False) == 3 and torch.get_num_threads() == 3
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        assert affinity.size_team(None, offload_on_gpu=False) == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_a_second_engine_sizes_from_the_cores_not_from_the_first_ones_pool(monkeypatch):
    """Unpinned, each engine of a process starts from the pool torch (or the user) chose: never one thread
    fewer per engine."""
    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(affinity, "_sized", None)
    try:
        torch.set_num_threads(4)
        assert [affinity.size_team(None, offload_on_gpu=True) for _ in range(3)] == [3, 3, 3]
        assert affinity.size_team(None, offload_on_gpu=False) == 4  # a CPU engine after them: the whole pool
        torch.set_num_threads(2)  # the user's own choice since: it is the pool now
        assert affinity.size_team(None, offload_on_gpu=True) == 1
    finally:
        torch.set_num_threads(before)
