"""zero_core.offload_stream_balance (zero_core/optim/chunk_claims.py): once its own streamed chunks are queued, the
GPU takes the host's chunks from the back until the two sides meet. Whoever updates a chunk, the step is bitwise the
plain host step's, every chunk is updated once, and the 16-bit chunks are published once each in partition order.
On a CPU run the "GPU" is a host thread running the same fused kernel."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from test_streamed_update import CHUNK, _config, _run

from zero_core import ConfigError, load_config
from zero_core.optim import HostAdamW, Hyper
from zero_core.optim.chunk_claims import ChunkClaims
from zero_core.optim.states import TensorStates


def test_claims_hand_out_each_chunk_once_from_both_ends():
    claims = ChunkClaims([0, 10, 20, 30, 40])
    assert claims.front() == 0 and claims.back() == 40 and claims.back() == 30 and claims.front() == 10
    assert claims.front() == 20
    assert claims.front() is None and claims.back() is None
    assert claims.from_back == [40, 30]


def test_claims_taken_by_two_threads_at_once_cover_every_chunk_once():
    starts = list(range(0, 20_000, 4))
    claims, taken = ChunkClaims(starts), {"front": [], "back": []}

    def take(side: str) -> None:
        while (a := getattr(claims, side)()) is not None:
            taken[side].append(a)

    threads = [threading.Thread(target=take, args=(side,)) for side in ("front", "back")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(taken["front"] + taken["back"]) == starts
    assert taken["front"] == sorted(taken["front"]) and taken["back"] == sorted(taken["back"], reverse=True)
    assert not taken["front"] or not taken["back"] or max(taken["front"]) < min(taken["back"])


@pytest.mark.parametrize("clip", [0.0, 1e-3])  # unclipped, and clipping engaged
@pytest.mark.parametrize("lazy", [True, False])  # gradient rebuilt from staging, or the folded fp32 one
@pytest.mark.parametrize("hold", [False, True])
def test_a_slow_host_gives_its_last_chunks_to_the_gpu_and_the_step_is_the_same(monkeypatch, clip, lazy, hold):
    plain, plain_outs, _, plain_published, _ = _run(0.0, 0.0, clip, lazy, monkeypatch, steps=2)
    states, outs, host_pieces, published, opt = _run(0.5, 0.0, clip, lazy, monkeypatch, steps=2, hold=hold,
                                                     balance=True, host_waits_for=2)
    # host chunks [0, 1024), [2048, 3072), [4096, 5000): the GPU takes the last two while the host waits in its first
    # (or all three, if it got there before the host claimed one)
    assert opt.taken_by_device[:2] == [4096, 2048]
    assert all(hi <= 1024 for lo, hi, _ in host_pieces)  # the host did its first chunk at most
    for name in ("master", "exp_avg", "exp_avg_sq"):
        assert torch.equal(getattr(plain, name), getattr(states, name)), name
    assert all(torch.equal(a, b) for a, b in zip(plain_outs, outs))
    assert published == plain_published  # once each, in partition order


def test_balance_off_leaves_the_host_its_chunks(monkeypatch):
    _, _, host_pieces, _, opt = _run(0.5, 0.0, 1e-3, True, monkeypatch, steps=1, host_delay=0.05)  # balance off
    assert opt.taken_by_device == []
    assert sorted({(lo // CHUNK) * CHUNK for lo, _, _ in host_pieces}) == [0, 2048, 4096]


def _speculated_step(monkeypatch, overlap: float, stream: float) -> tuple[TensorStates, HostAdamW, list]:
    """One unclipped step whose shards were all final (and, with `overlap`, updated) before backward ended."""
    monkeypatch.setenv("ZERO_CORE_HOST_CHUNK_NUMEL", str(CHUNK))
    states = TensorStates(4096, torch.device("cpu"))
    states.master.copy_(torch.randn(4096, generator=torch.Generator().manual_seed(5)))
    opt = HostAdamW(states, comm_dtype=torch.float32, clip=0.0, overlap_fraction=overlap, stream_fraction=stream,
                    groups=[Hyper(0.9, 0.95, 1e-8, 0.1)], decoupled=True, lr_at=lambda a: torch.full((1,), 1e-2),
                    shard_stats=False, comm_device=torch.device("cpu"))
    grads = torch.randn(4096, generator=torch.Generator().manual_seed(6))
    opt.begin_pass(torch.ones(1), accumulate=False, final=True)
    opt.receive(grads[1024:].clone(), 1024)
    opt.receive(grads[:1024].clone(), 0)
    opt._folder.wait()  # every shard's turn on the fold thread comes while backward still runs
    opt.end_pass()
    speculated = [(lo, hi) for lo, hi, _ in opt.speculative.ranges]
    adam = opt._adam_pieces
    monkeypatch.setattr(opt, "_adam_pieces", lambda *a: (time.sleep(0.05), adam(*a)))  # a slow host
    opt.step(torch.empty(4096, dtype=torch.bfloat16))
    opt.close()
    return states, opt, speculated


def test_a_step_with_speculated_updates_is_not_shared(monkeypatch):
    """Chunks updated during backward (overlap_host_update) are the host's to finish: no claims that step."""
    plain, _, _ = _speculated_step(monkeypatch, 0.0, 0.0)
    states, opt, speculated = _speculated_step(monkeypatch, 1.0, 0.5)
    assert sorted(speculated) == [(0, 1024), (2048, 3072)] and opt.taken_by_device == []
    assert all(torch.equal(getattr(plain, n), getattr(states, n)) for n in ("master", "exp_avg", "exp_avg_sq"))


@pytest.mark.parametrize("zero_core, problem", [
    ({"offload_stream_fraction": 0.5}, True),  # on by default
    ({"offload_stream_fraction": 0.5, "offload_stream_balance": False}, False),
    ({"offload_stream_balance": True}, True),  # nothing streamed: nothing to share, and it loads
    ({"offload_stream_fraction": 0.5, "offload_stream_balance": "yes"}, "offload_stream_balance"),
])
def test_the_switch_is_validated(zero_core, problem):
    cfg = _config(zero_core, {"device": "cpu"})
    if isinstance(problem, str):
        with pytest.raises(ConfigError, match=problem):
            load_config(cfg, world_size=1)
    else:
        assert load_config(cfg, world_size=1).zero_core.offload_stream_balance is problem


@pytest.mark.parametrize("balance", [False, True])
def test_the_locked_span_is_the_same_in_every_step(monkeypatch, balance):
    """On CUDA the streamed update page-locks the states it copies at its first step. A range overlapping one locked
    before cannot be locked again, so the span must not depend on whether this step shares chunks (a step that
    speculated does not): the whole partition when the GPU may take the host's chunks, else up to its last chunk."""
    from zero_core.optim import streamed_update

    locked: list[list[int]] = []
    monkeypatch.setattr(streamed_update, "lock_all", lambda ts, fix: locked.append([t.numel() for t in ts]) or [])
    states = TensorStates(5000, torch.device("cpu"))
    update = streamed_update.StreamedUpdate([(1024, 2048), (3072, 4096)], torch.device("cpu"), balance)
    update.cuda = True  # the locking path, on the CPU's tensors
    staging = torch.zeros(5000)
    args = dict(grad=lambda a, b: (staging[a:b], 1.0), out=None, pieces=lambda a, b: [(a, b, 0)],
                hyper=[dict(lr=0.0, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.0)], coef=1.0,
                step=torch.ones(()), decoupled=True)
    claims = [None, (ChunkClaims.of(5000, CHUNK, {1024, 3072}), CHUNK)] if balance else [None, None]
    for c in claims:
        update.start(states, **args, claims=c).finish(streamed_update.InOrder(None))
    span = 5000 if balance else 4096
    assert locked == [[span] * 4] * 2
