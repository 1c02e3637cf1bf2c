"""Stage 3 with optimizer offload: the host update runs on after `step()` and each unit's forward waits for its own
shard range (zero_core.overlap_weight_gather). On 2 gloo ranks, with the update's thread gated so that every
forward after an update really runs mid-update, training equals the update inside `step()` bit for bit:
weights, optimizer states, losses, skipped fp16 steps and the loss scale, with clipping, accumulation,
parameter offload, partial offload and states on NVMe; readers right after `step()` see the final weights; a
forward that did not wait would read stale shards (the sabotaged run differs); a failing update is one error on
the training thread; prefetches never read a unit the update has not published."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from dist_harness import run_ranks
from host_overlap_workers import SMALL, Gate, overlap_train
from parity_workers import ds_config, make_batches, make_model
from safetensors.torch import load_file

import zero_core

pytestmark = pytest.mark.slow  # spawned ranks or whole runs: outside the fast tier (-m 'not slow')

OPT = {"offload_optimizer": {"device": "cpu"}}
PARAM = {**OPT, "offload_param": {"device": "cpu"}}
BASE = [
    {"dtype": "fp16", "micro": 2, "steps": 4, "clip": 0.05, "inject_inf_at": 1, "zero": OPT, "read_at": 2},
    {"dtype": "fp32", "micro": 1, "gas": 2, "steps": 3, "clip": 0.05, "zero": PARAM, "read_at": 3},
    {"dtype": "fp16", "micro": 1, "gas": 2, "steps": 4, "clip": 0.05, "inject_inf_at": 2, "zero": PARAM},
    {"dtype": "bf16", "micro": 2, "steps": 3, "clip": 0.05,
     "zero": {**PARAM, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}},
    {"dtype": "fp32", "micro": 2, "steps": 3, "zero": {"offload_optimizer": {"device": "cpu", "ratio": 0.5}}},
    {"dtype": "bf16", "micro": 2, "steps": 3, "clip": 0.05, "zero": {**PARAM, "offload_optimizer": {"device": "nvme"}}},
]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    save_dir = str(tmp_path_factory.mktemp("s3_overlap_ckpt"))
    cases = [{**c, "overlap": overlap, "save_dir": f"{save_dir}/{i}"} for i, c in enumerate(BASE)
             for overlap in (False, True)]
    for case in cases:  # optimizer states on NVMe: a file per rank under the test's folder
        if case["zero"]["offload_optimizer"]["device"] == "nvme":
            case["zero"] = {**case["zero"], "offload_optimizer": {"device": "nvme", "nvme_path": save_dir}}
    cases.append({**BASE[1], "overlap": True, "blindfold": True, "read_at": None})
    return run_ranks(overlap_train, 2, cases)


@pytest.mark.parametrize("index", range(len(BASE)))
def test_overlapped_update_equals_the_update_in_step_bitwise(results, index):
    in_step, overlapped = results[2 * index], results[2 * index + 1]
    assert not in_step["inflight"] and overlapped["inflight"]
    assert overlapped["mid_update_waits"] > 0  # forwards ran while their units were not yet published
    if "inject_inf_at" in BASE[index]:
        assert in_step["skipped"] >= 1
    assert overlapped["losses"] == in_step["losses"]
    assert overlapped["skipped"] == in_step["skipped"] and overlapped["scale"] == in_step["scale"]
    assert not torch.equal(in_step["state"]["ln_f.weight"], make_model().ln_f.weight.float())
    for key in ("state", "optimizer"):
        for k, v in in_step[key].items():
            assert torch.equal(overlapped[key][k], v), (key, k)


@pytest.mark.parametrize("index", [i for i, c in enumerate(BASE) if c.get("read_at") is not None])
def test_readers_right_after_step_see_the_final_weights(results, index):
    in_step, overlapped = results[2 * index], results[2 * index + 1]
    for k, v in in_step["read_after"]["full"].items():
        assert torch.equal(overlapped["read_after"]["full"][k], v), k
    on, off = (sorted(Path(r["read_after"]["checkpoint"]).glob("*.safetensors")) for r in (overlapped, in_step))
    assert [p.name for p in on] == [p.name for p in off] and on
    for a, b in zip(on, off):
        ta, tb = load_file(str(a)), load_file(str(b))
        assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta), a.name


def test_a_forward_that_does_not_wait_reads_stale_shards(results):
    """The gate makes the check above meaningful: without the per-unit waits the forward runs on shards the
    update has not written yet, and training differs."""
    in_step, blind = results[2], results[-1]
    assert blind["losses"][0] == in_step["losses"][0] and blind["losses"] != in_step["losses"]


def _engine(**zero):
    """The overlapped host update (zero_core.overlap_weight_gather, off by default)."""
    return zero_core.initialize(make_model(), {**ds_config(3, "fp32", 2, clip=0.05, **{**PARAM, **zero}),
                                               "zero_core": {"overlap_weight_gather": True}})


def _train(engine, steps: int) -> None:
    for x, y in make_batches(steps, 2):
        engine.backward(engine(x.to(engine.device), y.to(engine.device)).loss)
        engine.step()


def test_module_state_dict_right_after_step_is_the_final_weights(monkeypatch):
    """One rank: module.state_dict() gathers every unit itself, after the update finished."""
    monkeypatch.setenv("ZERO_CORE_HOST_CHUNK_NUMEL", SMALL["ZERO_CORE_HOST_CHUNK_NUMEL"])
    states = []
    for overlap in (False, True):
        engine = zero_core.initialize(make_model(), {**ds_config(3, "fp32", 2, clip=0.05, **PARAM),
                                                     "zero_core": {"overlap_weight_gather": overlap}})
        gate = Gate(engine) if overlap else None
        _train(engine, 2)
        if gate is not None:
            assert engine.strategy.inflight._published < engine.strategy.inflight.bucket_ends[-1]  # still running
        states.append({k: v.clone() for k, v in engine.module.state_dict().items()})
        if gate is not None:  # the second forward waited for the update: the breakdown says so
            assert engine.breakdown.summary()["update_wait"] > 0
        engine.close()
    for k, v in states[0].items():
        assert torch.equal(states[1][k], v), k


def test_a_failing_host_update_is_one_error_on_the_training_thread(monkeypatch):
    engine = _engine()
    assert engine.strategy.inflight is not None
    _train(engine, 1)
    engine.wait_for_weights()  # the first update done with the real pieces: only the second one breaks
    real = engine.optimizer._adam_pieces

    def broken(*_):
        raise OSError("host memory went away")

    monkeypatch.setattr(engine.optimizer, "_adam_pieces", broken)
    x, y = (t.to(engine.device) for t in make_batches(2, 2)[1])
    engine.backward(engine(x, y).loss)
    engine.step()  # returns: the update runs (and fails) on its own thread
    with pytest.raises(RuntimeError, match=r"^the optimizer's host update failed: host memory went away$") as e:
        engine(x, y)
    assert isinstance(e.value.__cause__, OSError)
    engine.wait_for_weights()  # raised once
    monkeypatch.setattr(engine.optimizer, "_adam_pieces", real)
    engine.close()


def test_overlap_off_keeps_the_update_in_step():
    engine = zero_core.initialize(make_model(), ds_config(3, "fp32", 2, **PARAM))  # the default: off
    assert engine.strategy.inflight is None and engine.optimizer.adam_key == "cpu_adam"
    engine.close()
    engine = _engine()
    assert engine.optimizer.adam_key == "overlapped_cpu_adam"
    _train(engine, 2)
    assert engine.breakdown.summary()["overlapped_cpu_adam"] > 0 and engine.breakdown.summary()["cpu_adam"] == 0
    engine.close()


@pytest.mark.skipif(torch.cuda.is_available(), reason="fakes CUDA streams on a CPU-only engine")
def test_prefetches_never_read_a_unit_the_update_has_not_published(monkeypatch):
    """Prefetching (CUDA only, faked here) gathers the next units ahead of their forward: it must stop at the
    first unit whose shard range the update has not published yet."""
    from test_weight_gather import fake_streams

    fake_side = fake_streams(monkeypatch)
    monkeypatch.setenv("ZERO_CORE_HOST_CHUNK_NUMEL", SMALL["ZERO_CORE_HOST_CHUNK_NUMEL"])
    # every unit released after its forward (no reuse distance), so that backward prefetches them too
    engine = _engine(stage3_param_persistence_threshold=0, stage3_prefetch_bucket_size=10**6,
                     stage3_max_reuse_distance=0)
    gatherer, inflight = engine.strategy.gatherer, engine.strategy.inflight
    gatherer.side = fake_side
    Gate(engine)
    reads: list[tuple[int, int]] = []  # (end of the range a prefetch read, the published mark then)
    issue = gatherer._issue_gather

    def tracked_issue(g, asynchronous):
        if asynchronous:
            group = engine.layout.groups[g]
            reads.append((group.partition_offset + group.shard_numel, inflight._published))
        return issue(g, asynchronous)

    gatherer._issue_gather = tracked_issue
    _train(engine, 3)
    assert reads and all(end <= published for end, published in reads)
    engine.close()
