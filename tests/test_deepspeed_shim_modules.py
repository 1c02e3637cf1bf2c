"""DeepSpeed's names that save helpers, MoE models and comm-level code reach for: `ZeroParamStatus` and the
stage-3 parameter attributes (`ds_id`, `ds_status` following the unit's released state, `ds_numel`,
`ds_shape`), the ZeRO-3 leaf-module marks, `OnDevice`, `DeepSpeedDataLoader`, and `deepspeed.comm`'s additions
over torch.distributed (one process, no process group)."""

from __future__ import annotations

import pytest
import torch

import zero_core.deepspeed as deepspeed
from zero_core.deepspeed import comm

# DeepSpeed 0.19.8's enum values (deepspeed.runtime.zero.partition_parameters)
DS_STATUS = {"AVAILABLE": 1, "NOT_AVAILABLE": 2, "INFLIGHT": 3}


def _maybe_zero_3(param):  # the LLaVA / FastChat save helper, verbatim but for the logging
    from zero_core.deepspeed import zero
    from zero_core.deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    if hasattr(param, "ds_id"):
        assert param.ds_status in (ZeroParamStatus.AVAILABLE, ZeroParamStatus.NOT_AVAILABLE)
        with zero.GatheredParameters([param]):
            param = param.data.detach().cpu().clone()
    else:
        param = param.detach().cpu().clone()
    return param


def _engine(stage: int):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    cfg = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
           "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    for _ in range(2):
        engine.backward(engine(torch.randn(2, 6).to(engine.device)).pow(2).mean())
        engine.step()
    return engine


def test_zero_param_status_is_deepspeeds():
    from zero_core.deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    assert {s.name: s.value for s in ZeroParamStatus} == DS_STATUS
    assert deepspeed.zero.partition_parameters.ZeroParamStatus is ZeroParamStatus
    assert deepspeed.runtime.zero.ZeroParamStatus is ZeroParamStatus


def test_stage3_parameters_say_their_status_and_the_helper_saves_full_values():
    from zero_core.deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    engine = _engine(3)
    try:
        params = list(engine.module.named_parameters())
        assert len({p.ds_id for _, p in params}) == len(params)
        assert all(p.ds_numel == p.numel() and tuple(p.ds_shape) == tuple(p.shape) for _, p in params)
        assert {p.ds_status for _, p in params} == {ZeroParamStatus.NOT_AVAILABLE}
        with deepspeed.zero.GatheredParameters([p for _, p in params]):
            assert {p.ds_status for _, p in params} == {ZeroParamStatus.AVAILABLE}
        assert {p.ds_status for _, p in params} == {ZeroParamStatus.NOT_AVAILABLE}
        saved = {n: _maybe_zero_3(p) for n, p in params}
        full = engine.full_state_dict()
        for n, v in saved.items():
            assert torch.equal(v, full[n].to(v.dtype)), n
    finally:
        engine.close()


def test_below_stage3_parameters_are_plain():
    engine = _engine(2)
    try:
        assert not any(hasattr(p, "ds_id") for p in engine.module.parameters())
    finally:
        engine.close()


def test_leaf_module_marks_are_set_and_read_back():
    from zero_core.deepspeed.utils import (get_z3_leaf_modules, set_z3_leaf_modules, set_z3_leaf_modules_by_name,
                                           unset_z3_leaf_modules, z3_leaf_module)

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.Linear(2, 2)), torch.nn.ReLU())
    assert set_z3_leaf_modules(model, ["Linear"]) == [model[0], model[1][0]]
    assert get_z3_leaf_modules(model) == [model[0], model[1][0]] and z3_leaf_module(model[0])
    unset_z3_leaf_modules(model, [torch.nn.Linear])
    assert get_z3_leaf_modules(model) == []
    assert set_z3_leaf_modules_by_name(model, ["1", "x"], raise_if_not_found=False) == ([model[1]], ["x"])
    with pytest.raises(ValueError, match="No modules of type"):
        set_z3_leaf_modules(model, [torch.nn.Conv1d])


def test_on_device_builds_on_the_device_in_the_dtype():
    before = torch.get_default_dtype()
    with deepspeed.OnDevice(dtype=torch.bfloat16, device="meta"):
        layer = torch.nn.Linear(4, 4)
    assert layer.weight.device.type == "meta" and layer.weight.dtype == torch.bfloat16
    assert torch.get_default_dtype() == before and torch.empty(1).device.type == "cpu"


def test_runtime_modules_reached_as_attributes():
    assert deepspeed.runtime.activation_checkpointing.checkpointing.checkpoint is deepspeed.checkpointing.checkpoint
    loader = deepspeed.runtime.dataloader.DeepSpeedDataLoader(list(range(10)), batch_size=4, pin_memory=False,
                                                              local_rank=0, tput_timer=None)
    batches = [b.tolist() for b in loader]  # a DistributedSampler's shuffled order, as DeepSpeed's
    assert [len(b) for b in batches] == [4, 4, 2] and sorted(sum(batches, [])) == list(range(10))
    assert len(loader) == 3


def test_comm_additions_over_torch_distributed():
    x = torch.tensor([1.0, 2.0])
    out = torch.zeros(2)
    comm.allgather_fn(out, x)
    assert out.tolist() == [1.0, 2.0]
    comm.reduce_scatter_fn(out.zero_(), x)
    assert out.tolist() == [1.0, 2.0]
    assert comm.has_all_gather_into_tensor() and comm.has_reduce_scatter_tensor()
    assert comm.get_all_ranks_from_group() == [] and comm.get_world_group() is torch.distributed.group.WORLD
    assert comm.timed_op(len) is len and comm.configure(enabled=True, prof_all=True) is None
    assert comm.comms_logger.enabled is False and comm.new_group is torch.distributed.new_group
    with pytest.raises(AttributeError, match=r"deepspeed\.comm\.no_such_call is not provided by zero_core"):
        comm.no_such_call  # noqa: B018
