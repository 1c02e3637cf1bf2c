"""The device optimizer keeps fp32 gradients only between a bucket's first reduction and the step:
one part per bucket, allocated on arrival, accumulated across micro-steps, freed by the update."""

from __future__ import annotations

import pytest
import torch

from zero_core.optim import DeviceAdamW, Hyper
from zero_core.optim.states import TensorStates

HYPER = dict(groups=[Hyper(0.9, 0.95, 1e-8, 0.0)], decoupled=True, clip=0.0,
             lr_at=lambda applied: torch.full((1,), 1e-2), shard_stats=False, comm_device=torch.device("cpu"))
SEGMENTS = [(0, 128), (128, 64), (192, 256)]


def _optimizer() -> DeviceAdamW:
    states = TensorStates(448, torch.device("cpu"))
    w = states.writer()
    w.write(torch.linspace(-1, 1, 448))
    w.close()
    return DeviceAdamW(states, runs=[[(lo, lo + n, 0)] for lo, n in SEGMENTS], **HYPER)


def test_parts_live_from_first_reduction_to_the_step():
    opt = _optimizer()
    assert opt._parts == {}
    one = torch.full((1,), 1.0)
    opt.begin_pass(one, accumulate=False, final=False)
    opt.receive(torch.full((128,), 2.0), 0)
    opt.begin_pass(one, accumulate=True, final=True)  # the next micro-step's pass: only the last counts for the norm
    opt.receive(torch.full((128,), 3.0), 0)  # a second micro-step adds
    opt.receive(torch.full((256,), 0.5, dtype=torch.bfloat16), 192)  # a first arrival starts fresh
    assert sorted(opt._parts) == [0, 192]  # the middle bucket got nothing: no part yet
    assert torch.equal(opt.gradient(0, 128), torch.full((128,), 5.0))
    assert torch.equal(opt.gradient(192, 256), torch.full((256,), 0.5))
    assert torch.equal(opt.gradient(128, 64), torch.zeros(64))
    before = opt.master.clone()
    opt.step(out=None)
    assert opt._parts == {}  # freed by the update
    moved = (opt.master - before).abs()
    assert (moved[:128] > 0).all() and (moved[192:] > 0).all()
    assert torch.equal(moved[128:192], torch.zeros(64))  # zero gradient, no weight decay: unchanged
    assert float(opt.sumsq[0]) == pytest.approx(128 * 25.0 + 256 * 0.25)


def test_first_reduction_after_a_step_does_not_accumulate_stale_values():
    opt = _optimizer()
    one = torch.full((1,), 1.0)
    opt.begin_pass(one, accumulate=False, final=True)
    opt.receive(torch.full((64,), 7.0), 128)
    opt.step(out=None)
    opt.begin_pass(one, accumulate=True, final=True)
    opt.receive(torch.full((64,), 1.0), 128)  # "accumulate" into a freed part: starts fresh
    assert torch.equal(opt.gradient(128, 64), torch.ones(64))


def test_a_shard_that_is_not_a_segment_is_refused():
    opt = _optimizer()
    with pytest.raises(ValueError, match="not one of the optimizer's segments"):
        opt.begin_pass(torch.ones(1), accumulate=False, final=True)
        opt.receive(torch.ones(100), 0)


def _engine_after_steps(stage: int, steps: int = 2, **zero_core_keys):
    import zero_core
    from parity_workers import ds_config, make_batches, make_model

    extra = {"stage3_param_persistence_threshold": 0} if stage == 3 else {}  # blocks are released after use
    cfg = ds_config(stage, "bf16", 2, **extra)
    if zero_core_keys:
        cfg["zero_core"] = zero_core_keys
    engine = zero_core.initialize(make_model(), cfg)
    for x, y in make_batches(steps, 2):
        engine.backward(engine(x, y).loss)
        if steps and engine.is_gradient_accumulation_boundary():
            assert engine.memory_bytes()["gradients"] > 0  # reduced, not yet consumed
        engine.step()
    return engine


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_engine_keeps_no_gradient_and_no_16bit_shard_copy_between_steps(stage):
    engine = _engine_after_steps(stage)
    mem = engine.memory_bytes()
    n = engine.layout.partition_numel
    assert mem["gradients"] == 0
    assert mem["optimizer_states"] == 12 * n  # fp32 master, exp_avg, exp_avg_sq
    # stages 1-2 update the shard inside the full buffer; stage 3 all-gathers from its fp32 master (by default)
    assert mem["working_shard"] == 0
    full = sum(g.padded_numel for g in engine.layout.groups) * 2
    assert mem["working_weights"] == full if stage < 3 else mem["working_weights"] < full


def test_stage3_keeps_a_16bit_shard_copy_only_when_told_to():
    engine = _engine_after_steps(3, stage3_gather_from_master=False)
    assert engine.memory_bytes()["working_shard"] == 2 * engine.layout.partition_numel


@pytest.mark.parametrize("stage", [1, 2])
def test_offloaded_stages_1_2_upload_into_the_full_buffer_not_a_16bit_copy(stage):
    """With optimizer offload the host's 16-bit output goes straight into each bucket's shard of the full
    working buffer (GPT-2 XL on 2 ranks: 1.45 GiB less per GPU than a separate device partition)."""
    import zero_core
    from parity_workers import ds_config, make_batches, make_model

    engine = zero_core.initialize(make_model(), ds_config(stage, "bf16", 2, offload_optimizer={"device": "cpu"}))
    before = {k: v.clone() for k, v in engine.module.state_dict().items()}
    for x, y in make_batches(2, 2):
        engine.backward(engine(x, y).loss)
        engine.step()
    assert engine.memory_bytes()["working_shard"] == 0
    after = engine.module.state_dict()
    assert any(not torch.equal(after[k], v) for k, v in before.items())  # the uploads reached the module's weights
    master = engine.full_state_dict()
    for k, v in after.items():
        if v.is_floating_point() and k in master:
            assert torch.equal(v, master[k].to(v.dtype)), k  # working weights == the cast of the fp32 masters
    engine.close()
