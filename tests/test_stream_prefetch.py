"""zero_core.offload_stream_prefetch (zero_core/optim/stream_prefetch.py): the streamed chunks' states copied during
the backward before the step give bitwise the step that uploads them in the update, clipped, skipped or not, and
a state read or write between backward and step (a checkpoint load) drops what was copied."""

from __future__ import annotations

import pytest
import torch
from test_streamed_update import _run

from zero_core import ConfigError, load_config
from zero_core.optim.held_grads import HeldGrads
from zero_core.optim.stream_prefetch import StatePrefetch


def _same(a, b) -> None:
    for name in ("master", "exp_avg", "exp_avg_sq"):
        assert torch.equal(getattr(a[0], name), getattr(b[0], name)), name
    assert all(torch.equal(x, y) for x, y in zip(a[1], b[1]))  # the 16-bit outputs of every step
    assert a[3] == b[3]  # published once each, in partition order


def _count_taken(monkeypatch) -> list:
    taken = []
    take = StatePrefetch.take

    def counted(self, a):
        got = take(self, a)
        taken.append(got is not None)
        return got

    monkeypatch.setattr(StatePrefetch, "take", counted)
    return taken


@pytest.mark.parametrize("clip", [0.0, 1e-3])  # unclipped, and clipping engaged
@pytest.mark.parametrize("hold", [False, True])  # gradients from staging, or held where reduced
def test_fetched_states_give_the_same_steps_bitwise(monkeypatch, clip, hold):
    plain = _run(0.5, 0.0, clip, True, monkeypatch, steps=4, inf_at=1, hold=hold)
    taken = _count_taken(monkeypatch)
    fetched = _run(0.5, 0.0, clip, True, monkeypatch, steps=4, inf_at=1, hold=hold, prefetch=True)
    _same(plain, fetched)
    # both streamed chunks came from backward's copies in the three applied steps (the skipped one dropped them)
    assert taken.count(True) == 6 and fetched[4].prefetch.fetched == {}


def test_accumulating_passes_give_the_same_steps(monkeypatch):
    plain = _run(0.5, 0.0, 1e-3, False, monkeypatch)
    taken = _count_taken(monkeypatch)
    _same(plain, _run(0.5, 0.0, 1e-3, False, monkeypatch, prefetch=True))
    assert taken.count(True) == 6


def test_states_replaced_between_backward_and_step_are_not_taken_from_the_copies(monkeypatch):
    """A checkpoint load between backward and step goes through `undo_speculation` (model_export.settled) and then
    writes the states: the step must update what was loaded, not what backward copied."""

    def load(opt, step):
        opt.undo_speculation()
        for name in ("master", "exp_avg", "exp_avg_sq"):
            getattr(opt.states, name).add_(0.5 * (step + 1))

    plain = _run(0.5, 0.0, 0.0, True, monkeypatch, between=load)
    taken = _count_taken(monkeypatch)
    _same(plain, _run(0.5, 0.0, 0.0, True, monkeypatch, between=load, prefetch=True))
    assert taken and not any(taken)


def test_held_buffers_still_to_come():
    held = HeldGrads([(0, 8), (8, 16)], enabled=True)
    held.begin(lazy=True)
    assert held.to_come() == 16 * 2  # nothing allocated yet (2 bytes until a shard says otherwise)
    held.take(torch.ones(4), 10)  # the second chunk's buffer is allocated whole
    assert held.to_come() == 8 * 4  # fp32 shards: 4 bytes per element
    held.take(torch.ones(2), 0)
    assert held.to_come() == 0
    held.begin(lazy=False)  # a pass that holds nothing leaves nothing to come
    assert held.to_come() == 0


@pytest.mark.parametrize("value, problem", [(True, None), (False, None), ("yes", "offload_stream_prefetch")])
def test_the_key(value, problem):
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_core": {"offload_stream_prefetch": value},
           "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    if problem is None:
        assert load_config(cfg, world_size=1).zero_core.offload_stream_prefetch is value
        return
    with pytest.raises(ConfigError, match=problem):
        load_config(cfg, world_size=1)
