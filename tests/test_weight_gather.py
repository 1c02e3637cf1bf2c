"""Stages 1-2 start each bucket's weight all-gather right after its update and let each module's forward
wait for its own buckets. Here the gathers are made lazy (they run only when waited for), so a module
that ran without waiting would read stale weights and change the loss: the deferred run must match the
run that gathers everything at the end of the step, bit for bit."""

from __future__ import annotations

import pytest
import torch

from dist_harness import run_ranks
from parity_workers import ds_config, make_batches, make_model

pytestmark = pytest.mark.slow  # spawned ranks or whole runs: outside the fast tier (-m 'not slow')


STARTED: list[str] = []  # the order the gathers were started in (this process)


class _LazyWork:
    def __init__(self, full: torch.Tensor, shard: torch.Tensor, what: str) -> None:
        self.args = (full, shard, what)
        STARTED.append(what)

    def wait(self) -> None:
        from zero_core import comm

        comm.all_gather_flat(*self.args)


def _lazy_gathers() -> None:
    from zero_core import comm

    comm.all_gather_flat_async = lambda full, shard, what="": comm.PendingCollective(_LazyWork(full, shard, what), what)


def _train(rank: int, world: int, stage: int, overlap: bool, sabotage: bool = False) -> dict:
    import zero_core

    _lazy_gathers()
    micro = 2
    cfg = ds_config(stage, "bf16", micro)
    cfg["zero_core"] = {"overlap_weight_gather": overlap}
    engine = zero_core.initialize(make_model(), cfg)
    losses, in_flight_after_step = [], []
    for x, y in make_batches(4, micro * world):
        xs, ys = (t[rank * micro : (rank + 1) * micro].to(engine.device) for t in (x, y))
        if sabotage and engine.strategy.deferred is not None and engine.global_step > 0:
            for h in engine.strategy.deferred._hooks:  # forward no longer waits: it reads last step's weights
                h.remove()
        loss = engine(xs, ys).loss
        losses.append(float(loss))
        engine.backward(loss)
        engine.step()
        in_flight_after_step.append(engine.strategy.deferred.in_flight if engine.strategy.deferred is not None else 0)
    state_via_module = {k: v.float().clone() for k, v in engine.module.state_dict().items()}  # waits (state_dict hook)
    first_step = STARTED[: len(engine.layout.groups)]
    root = sorted(
        {
            engine.layout.slots[i].group
            for i, p in enumerate(engine.params)
            if any(p is q for q in engine.module._parameters.values())
            or any(p is q for m in (engine.module.wte, engine.module.wpe, engine.module.ln_f) for q in m.parameters())
        }
    )
    out = {
        "losses": losses,
        "in_flight": in_flight_after_step,
        "buckets": len(engine.layout.groups),
        "first_step": [int(w.split("bucket ")[1].rstrip(")")) for w in first_step],
        "root_buckets": root,
        "layout_names": [s.name for s in engine.layout.slots],
        "model_names": [n for n, p in engine.module.named_parameters() if p.requires_grad],
        "module_state": state_via_module,
        "state": engine.full_state_dict(),
    }
    engine.close()
    return out


@pytest.mark.parametrize("stage", [1, 2])
def test_deferred_weight_gather_matches_gathering_at_step_end(stage):
    deferred = run_ranks(_train, 2, stage, True)
    eager = run_ranks(_train, 2, stage, False)
    assert deferred["buckets"] > 3
    assert deferred["in_flight"] == [deferred["buckets"]] * 4  # every bucket's gather was left in flight
    assert eager["in_flight"] == [0] * 4
    assert deferred["losses"] == eager["losses"]
    # the buckets read before the first block are updated and gathered first, then the rest in forward order
    root = deferred["root_buckets"]
    assert 0 < len(root) < deferred["buckets"] and root[-1] == deferred["buckets"] - 1  # ln_f sits in the last bucket
    assert deferred["first_step"] == root + [b for b in range(deferred["buckets"]) if b not in root]
    assert (
        deferred["layout_names"] == deferred["model_names"]
    )  # buckets keep the model's order (backward frees them in turn)
    for k, v in eager["state"].items():
        assert torch.equal(deferred["state"][k], v), k
    for k, v in eager["module_state"].items():
        assert torch.equal(deferred["module_state"][k], v), k  # module.state_dict() waited for the gathers


def test_a_forward_that_does_not_wait_reads_stale_weights():
    """The check above can fail: without the hooks the lazy gathers are not done when the model runs."""
    eager = run_ranks(_train, 2, 2, False)
    unhooked = run_ranks(_train, 2, 2, True, True)
    assert unhooked["losses"][0] == eager["losses"][0]
    assert unhooked["losses"][1] != eager["losses"][1]


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_stage3_gathering_from_the_fp32_master_equals_keeping_a_16bit_copy(dtype):
    """zero_core.stage3_gather_from_master casts each unit's fp32 master shard on the way into its
    all-gather; the 16-bit copy it replaces held the same cast, so training is bitwise the same,
    skipped fp16 steps included."""
    from parity_workers import zero_train

    base = {
        "stage": 3,
        "dtype": dtype,
        "micro": 2,
        "gas": 2,
        "steps": 4,
        "clip": 1.0,
        "inject_inf_at": 3,
        "zero": {"stage3_param_persistence_threshold": 0},
    }
    cast, copy = run_ranks(
        zero_train, 2, [{**base, "zero_core": {"stage3_gather_from_master": flag}} for flag in (True, False)]
    )
    assert cast["skipped"] == copy["skipped"] >= 1
    assert cast["losses"] == copy["losses"]
    for k, v in copy["state"].items():
        assert torch.equal(cast["state"][k], v), k


class _FakeSide:
    """A side stream on the CPU: records whether work is being queued 'on' it."""

    def __init__(self) -> None:
        self.stream, self.active = object(), False

    def after_current(self):
        import contextlib

        @contextlib.contextmanager
        def ctx():
            self.active = True
            try:
                yield
            finally:
                self.active = False

        return ctx()


def fake_streams(monkeypatch) -> _FakeSide:
    """CUDA events and the current stream made no-ops on a CPU-only engine; a side stream to put on it."""

    class _Event:
        def record(self) -> None:
            pass

    class _Stream:
        def wait_event(self, ev) -> None:
            pass

    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: _Stream())
    return _FakeSide()


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="fakes CUDA streams on a CPU-only engine; a GPU machine would "
    "give the engine real CUDA tensors (the ZB_TEST_DEVICE=cuda tests cover the real streams)",
)
def test_stage3_prefetched_shards_are_made_on_the_stream_that_gathers_them(monkeypatch):
    """A shard cast from the master on the compute stream and read by the side stream's all-gather can
    have its memory reused mid-gather (what broke the first GPU run): prefetches must build it on the
    side stream. Streams are faked on the CPU to check where each shard is made."""
    import zero_core
    from parity_workers import ds_config, make_batches, make_model

    fake_side = fake_streams(monkeypatch)
    cfg = ds_config(3, "bf16", 2, stage3_param_persistence_threshold=0, stage3_prefetch_bucket_size=10**6)
    cfg["zero_core"] = {"stage3_gather_from_master": True}
    engine = zero_core.initialize(make_model(), cfg)
    gatherer = engine.strategy.gatherer
    side = gatherer.side = fake_side
    made: list[tuple[bool, bool]] = []  # (asynchronous gather, made while on the side stream)
    issue, shard_of = gatherer._issue_gather, gatherer.shard_of
    state = {"async": False}

    def tracked_issue(g, asynchronous):
        state["async"] = asynchronous
        return issue(g, asynchronous)

    def tracked_shard(lo, hi):
        made.append((state["async"], side.active))
        return shard_of(lo, hi)

    gatherer._issue_gather, gatherer.shard_of = tracked_issue, tracked_shard
    for x, y in make_batches(3, 2):
        loss = engine(x, y).loss
        engine.backward(loss)
        engine.step()
    prefetched = [on_side for asynchronous, on_side in made if asynchronous]
    assert prefetched and all(prefetched)
    engine.close()


@pytest.mark.parametrize("overlap", [True, False])
def test_stage2_training_repeats_bitwise(overlap):
    """Two identical runs in one process give identical losses and weights (with or without the deferred
    gathers): the exact comparisons of this file rely on it, and a stale read would break it."""
    from parity_workers import zero_train

    case = {
        "stage": 2,
        "dtype": "fp32",
        "micro": 2,
        "gas": 2,
        "steps": 4,
        "clip": 1.0,
        "zero_core": {"overlap_weight_gather": overlap},
    }
    first, second = run_ranks(zero_train, 2, [case, case])
    assert first["losses"] == second["losses"]
    for k, v in first["state"].items():
        assert torch.equal(second["state"][k], v), k


def _weights_after_step(rank: int, world: int, stage: int) -> bool:
    """The config as a DeepSpeed script writes it (no zero_core section): the model's parameters read right after
    step() are the ones the next forward uses, as under DeepSpeed (gathers lazy, so a deferred one would show)."""
    import zero_core.deepspeed as deepspeed

    _lazy_gathers()
    micro = 2
    model = make_model()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=ds_config(stage, "bf16", micro))
    same = []
    for x, y in make_batches(3, micro * world):
        xs, ys = (t[rank * micro : (rank + 1) * micro].to(engine.device) for t in (x, y))
        engine.backward(engine(xs, ys).loss)
        engine.step()
        read = [p.detach().clone() for p in engine.module.parameters()]  # an EMA's or a weight log's read
        engine.wait_for_weights()
        same.append(all(torch.equal(a, p) for a, p in zip(read, engine.module.parameters())))
    engine.close()
    return all(same)


@pytest.mark.parametrize("stage", [1, 2])
def test_weights_read_after_step_are_current_by_default(stage):
    assert run_ranks(_weights_after_step, 2, stage)


def test_zbench_runs_turn_the_overlap_on_unless_the_config_says():
    from zbench.variants.zero import with_overlapped_weight_gather

    assert with_overlapped_weight_gather({"a": 1})["zero_core"] == {"overlap_weight_gather": True}
    mine = {"zero_core": {"overlap_weight_gather": False, "async_checkpoint": True}}
    assert with_overlapped_weight_gather(mine)["zero_core"] == mine["zero_core"]
