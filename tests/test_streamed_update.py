"""Chunks of the host share updated by the device kernel over streamed states (zero_core/optim/streamed_update.py):
on a CPU run the same result as the host step bitwise; the host never updates the streamed chunks itself, never
speculates on them, and every 16-bit chunk is published once, in partition order, whichever side finishes first.
(Whole-engine runs against plain offload: tests/test_partial_offload.py.)"""

from __future__ import annotations

import time

import pytest
import torch

from zero_core import ConfigError, load_config
from zero_core.optim import HostAdamW, Hyper
from zero_core.optim.states import TensorStates
from zero_core.optim.streamed_update import InOrder, streamed_chunks

CHUNK = 1024


def test_in_order_holds_back_ranges_that_finish_early():
    published = []
    order = InOrder(lambda a, b: published.append((a, b)))
    order.done(2048, 3072)  # a host chunk, finished before the streamed ones ahead of it
    assert published == []
    order.done(0, 1024)
    order.done(1024, 2048)
    order.done(3072, 3500)
    assert published == [(0, 1024), (1024, 2048), (2048, 3072), (3072, 3500)]


@pytest.mark.parametrize("numel, fraction, expect", [
    (10_000, 0.5, [(1024, 2048), (3072, 4096), (5120, 6144), (7168, 8192), (9216, 10_000)]),
    (10_000, 0.05, []),
    (3000, 1.0, [(0, 1024), (1024, 2048), (2048, 3000)]),
    (8192, 0.3, [(3072, 4096), (6144, 7168)]),
])
def test_streamed_chunks_are_spread_evenly(numel, fraction, expect):
    assert streamed_chunks(numel, fraction, CHUNK) == expect


def _run(fraction: float, overlap: float, clip: float, lazy: bool, monkeypatch, steps: int = 3,
         shards=((2560, 5000), (0, 2560)), inf_at: int | None = None, grads_seen: list | None = None,
         hold: bool = False, balance: bool = False, host_delay: float = 0.0, host_waits_for: int = 0):
    """`steps` steps of a HostAdamW over 5,000 elements, each backward sending `shards` (the last first); the
    states, the outputs, what the host loop updated itself and the publications. `inf_at`: the step whose
    gradient is not finite (skipped); `grads_seen` collects each step's gradient as `gradient_of` reads it;
    `balance`: the GPU may take the host's chunks (tests/test_stream_balance.py; off here, so that what the host
    updates is fixed); `host_delay` seconds are added to each of the host's chunks, and each waits until the GPU
    has taken `host_waits_for` of them (10 s at most): a slow host, whose chunks the GPU takes from the back."""
    monkeypatch.setenv("ZERO_CORE_HOST_CHUNK_NUMEL", str(CHUNK))
    numel = 5000
    states = TensorStates(numel, torch.device("cpu"))
    states.master.copy_(torch.randn(numel, generator=torch.Generator().manual_seed(3)))
    opt = HostAdamW(states, comm_dtype=torch.bfloat16, clip=clip, overlap_fraction=overlap, stream_fraction=fraction,
                    hold_grads=hold, balance=balance,
                    groups=[Hyper(0.9, 0.95, 1e-8, 0.1), Hyper(0.8, 0.99, 1e-6, 0.0)], decoupled=True,
                    lr_at=lambda a: torch.tensor([1e-2, 3e-3]), shard_stats=False, comm_device=torch.device("cpu"),
                    runs=[[(0, 1536, 0), (1536, 2560, 1)], [(2560, 5000, 0)]])
    host_pieces, published, outs = [], [], []
    adam = opt._adam_pieces
    def slow(deadline: float) -> None:
        time.sleep(host_delay)
        while len(opt.taken_by_device) < host_waits_for and time.monotonic() < deadline:
            time.sleep(0.002)

    monkeypatch.setattr(opt, "_adam_pieces", lambda v, lo, pieces, *a: (
        host_pieces.extend(pieces), slow(time.monotonic() + 10), adam(v, lo, pieces, *a)))
    gen = torch.Generator().manual_seed(11)
    for step in range(steps):
        micro = 1 if lazy else 2  # gradient accumulation folds into the fp32 gradient
        for m in range(micro):
            grads = torch.randn(numel, generator=gen)
            if step == inf_at:
                grads[1500] = float("inf")  # in a streamed chunk
            opt.begin_pass(torch.ones(1), accumulate=m > 0, final=m == micro - 1)
            for lo, hi in shards:
                opt.receive(grads[lo:hi].bfloat16(), lo)
            opt.end_pass()
        if grads_seen is not None:
            grads_seen.append(opt.gradient_of(0, numel))
        out = torch.zeros(numel, dtype=torch.bfloat16)
        opt.step(out, publish=lambda a, b: published.append((a, b)))
        outs.append(out)
    opt.close()
    return states, outs, host_pieces, published, opt


@pytest.mark.parametrize("clip", [0.0, 1e-3])  # unclipped, and clipping engaged (coefficient < 1)
@pytest.mark.parametrize("lazy", [True, False])  # the gradient rebuilt from staging, or the folded fp32 one
@pytest.mark.parametrize("overlap", [0.0, 1.0])  # speculated during backward, on the host's part only
def test_streamed_chunks_equal_the_host_step_bitwise(monkeypatch, clip, lazy, overlap):
    plain, plain_outs, _, plain_published, _ = _run(0.0, overlap, clip, lazy, monkeypatch)
    states, outs, host_pieces, published, opt = _run(0.5, overlap, clip, lazy, monkeypatch)
    assert opt.streamed_ranges == [(1024, 2048), (3072, 4096)]
    assert host_pieces and all(hi <= 1024 or 2048 <= lo and hi <= 3072 or lo >= 4096 for lo, hi, _ in host_pieces)
    for name in ("master", "exp_avg", "exp_avg_sq"):
        assert torch.equal(getattr(plain, name), getattr(states, name)), name
    for a, b in zip(plain_outs, outs):
        assert torch.equal(a, b)
    assert published == plain_published  # once each, in partition order
    assert [b for _, b in published[:5]] == [1024, 2048, 3072, 4096, 5000]


@pytest.mark.parametrize("clip", [0.0, 1e-3])
def test_gradients_held_on_the_device_give_the_same_step(monkeypatch, clip):
    """zero_core.offload_stream_hold_grads: the streamed chunks' gradients never reach staging (a chunk straddling two
    shards too) and the steps, the skipped one included, are bitwise those of the staged path."""
    shards = ((3500, 5000), (0, 3500))  # (3072, 4096) is filled from both
    seen_plain: list = []
    plain, plain_outs, _, plain_published, _ = _run(0.5, 0.0, clip, True, monkeypatch, steps=4, shards=shards,
                                                    inf_at=1, grads_seen=seen_plain)
    seen: list = []
    staged: list = []
    receive = HostAdamW.receive

    def receive_and_look(opt, reduced, offset):  # staging right after each shard, before any step
        if offset == 3500:  # the pass's first shard: staging marked
            opt.staging.fill_(7.0)
        receive(opt, reduced, offset)
        staged.append(opt.staging.clone())

    monkeypatch.setattr(HostAdamW, "receive", receive_and_look)
    states, outs, _, published, opt = _run(0.5, 0.0, clip, True, monkeypatch, steps=4, shards=shards, inf_at=1,
                                           grads_seen=seen, hold=True)
    assert opt.held.enabled and opt.streamed_ranges == [(1024, 2048), (3072, 4096)]
    last = staged[-1]  # after the pass's two shards: the streamed chunks were never written to staging
    assert torch.all(last[1024:2048] == 7.0) and torch.all(last[3072:4096] == 7.0)
    assert not torch.any(last[:1024] == 7.0) and not torch.any(last[2048:3072] == 7.0)
    for name in ("master", "exp_avg", "exp_avg_sq"):
        assert torch.equal(getattr(plain, name), getattr(states, name)), name
    assert all(torch.equal(a, b) for a, b in zip(plain_outs, outs))
    assert published == plain_published
    assert all(torch.equal(a, b) for a, b in zip(seen_plain, seen))  # gradient_of reads the held parts too
    assert opt.held._held == {}  # given up: read by the update, or dropped by the skipped step


def test_a_chunk_not_held_whole_is_read_from_staging():
    from zero_core.optim.held_grads import HeldGrads

    held = HeldGrads([(0, 8), (8, 16)], enabled=True)
    held.begin(lazy=True)
    assert held.take(torch.arange(12.0), 4) == []  # [4, 16): both chunks' parts, nothing for staging
    staging = torch.zeros(16)
    whole = held.pop(8, 16, staging)
    assert torch.equal(whole, torch.arange(4.0, 12.0))
    assert held.pop(0, 8, staging) is None  # only [4, 8) arrived: written back where the host reads it
    assert torch.equal(staging[:8], torch.tensor([0, 0, 0, 0, 0, 1, 2, 3.0]))
    held.begin(lazy=False)  # a pass that accumulates holds nothing
    assert held.take(torch.ones(16), 0) == [(0, 16)] and held.pop(0, 8, staging) is None
    held.begin(lazy=True)
    held.take(torch.full((6,), 5.0), 6)  # [6, 12) held: what staging would hold, read back by gradient_of
    assert torch.equal(held.staged(torch.zeros(16), 4, 10), torch.tensor([0, 0, 5, 5, 5, 5.0]))


def test_a_streamed_chunk_of_several_host_chunks(monkeypatch):
    """ZERO_CORE_STREAM_CHUNK_NUMEL: the GPU takes two host chunks at a time; the host skips both."""
    plain, plain_outs, _, plain_published, _ = _run(0.0, 0.0, 1e-3, True, monkeypatch)
    monkeypatch.setenv("ZERO_CORE_STREAM_CHUNK_NUMEL", str(2 * CHUNK - 100))  # rounded up to two host chunks
    states, outs, host_pieces, published, opt = _run(0.5, 0.0, 1e-3, True, monkeypatch)
    assert opt.streamed_ranges == [(2048, 4096)]
    assert host_pieces and all(hi <= 2048 or lo >= 4096 for lo, hi, _ in host_pieces)
    for name in ("master", "exp_avg", "exp_avg_sq"):
        assert torch.equal(getattr(plain, name), getattr(states, name)), name
    assert all(torch.equal(a, b) for a, b in zip(plain_outs, outs))
    assert (2048, 4096) in published and published != plain_published  # the GPU's chunk published at once

    def chained(ranges):  # in partition order, each range where the last ended (0 again at each step)
        return all(a == (prev if a else 0) for (_, prev), (a, _) in zip([(0, 0)] + ranges, ranges))

    assert chained(published) and [r for r in published if r[0] == 0] == [(0, 1024)] * 3


def test_speculation_leaves_the_streamed_chunks_alone(monkeypatch):
    monkeypatch.setenv("ZERO_CORE_HOST_CHUNK_NUMEL", str(CHUNK))
    states = TensorStates(4096, torch.device("cpu"))
    opt = HostAdamW(states, comm_dtype=torch.float32, clip=0.0, overlap_fraction=1.0, stream_fraction=0.5,
                    groups=[Hyper(0.9, 0.95, 1e-8, 0.1)], decoupled=True, lr_at=lambda a: torch.full((1,), 1e-2),
                    shard_stats=False, comm_device=torch.device("cpu"))
    opt.begin_pass(torch.ones(1), accumulate=False, final=True)
    opt.receive(torch.ones(3072), 1024)  # a shard over streamed and host chunks
    opt.receive(torch.ones(1024), 0)
    opt._folder.wait()  # every shard's turn on the fold thread comes while backward still runs
    opt.end_pass()
    assert sorted((lo, hi) for lo, hi, _ in opt.speculative.ranges) == [(0, 1024), (2048, 3072)]
    opt.step(torch.empty(4096, dtype=torch.bfloat16))
    opt.close()


def _config(zero_core: dict, offload: dict | None) -> dict:
    zero = {"stage": 2, **({"offload_optimizer": offload} if offload else {})}
    return {"train_micro_batch_size_per_gpu": 1, "zero_optimization": zero, "zero_core": zero_core}


@pytest.mark.parametrize("value, offload, problem", [
    (0.5, {"device": "cpu"}, None),
    (1.5, {"device": "cpu"}, "offload_stream_fraction"),
    (0.5, None, "offload_optimizer.device is 'none'"),
    (0.5, {"device": "nvme", "nvme_path": "/tmp"}, "offload_optimizer.device is 'nvme'"),
])
def test_the_fraction_is_validated(value, offload, problem):
    cfg = _config({"offload_stream_fraction": value}, offload)
    if problem is None:
        assert load_config(cfg, world_size=1).zero_core.offload_stream_fraction == value
        return
    with pytest.raises(ConfigError, match=problem):
        load_config(cfg, world_size=1)


def test_it_is_refused_beside_the_delayed_update():
    cfg = _config({"offload_stream_fraction": 0.5, "offload_delayed_update": True}, {"device": "cpu"})
    with pytest.raises(ConfigError, match="keep one"):
        load_config(cfg, world_size=1)


@pytest.mark.parametrize("zero_core, problem", [
    ({"offload_stream_fraction": 0.5, "offload_stream_hold_grads": True}, True),
    ({"offload_stream_fraction": 0.5}, True),  # on by default
    ({"offload_stream_fraction": 0.5, "offload_stream_hold_grads": False}, False),
    ({}, True),  # with nothing streamed, nothing is held: the printed config reloads
    ({"offload_stream_hold_grads": True}, True),
    ({"offload_stream_hold_grads": False}, False),
    ({"offload_stream_fraction": 0.5, "offload_stream_hold_grads": "yes"}, "offload_stream_hold_grads"),
])
def test_holding_the_gradients_is_validated(zero_core, problem):
    cfg = _config(zero_core, {"device": "cpu"})
    if isinstance(problem, bool):  # loads, holding or not
        assert load_config(cfg, world_size=1).zero_core.offload_stream_hold_grads is problem
        return
    with pytest.raises(ConfigError, match=problem):
        load_config(cfg, world_size=1)
