"""The module-level calls DeepSpeed's example scripts make, on `zero_core.deepspeed`: `deepspeed.comm` in a
single process (no process group, as zero_core makes none there), `deepspeed.accelerator.get_accelerator()` and
the memory and stream calls scripts log, `log_dist`, `see_memory_usage`, `RepeatingLoader`, and the names out of
zero_core's scope (the engine's calls: test_deepspeed_script_calls.py)."""

from __future__ import annotations

import pytest
import torch

import zero_core.deepspeed as deepspeed


def test_deepspeed_comm_answers_for_a_world_of_one():
    import zero_core.deepspeed.comm as dist

    assert not dist.is_initialized()
    assert (dist.get_rank(), dist.get_world_size(), dist.get_local_rank()) == (0, 1, 0)
    t = torch.tensor([3.0, 4.0])
    dist.all_reduce(t)
    dist.broadcast(t, 0)
    dist.barrier()
    out = [torch.zeros(2)]
    dist.all_gather(out, t)
    assert torch.equal(t, torch.tensor([3.0, 4.0])) and torch.equal(out[0], t)
    assert dist.new_group is torch.distributed.new_group  # the rest is torch.distributed's
    assert dist.log_summary() is None and dist.log_summary(return_dict=True) == {}  # no comms log is kept


def test_get_accelerator_names_this_machines_device():
    acc = deepspeed.accelerator.get_accelerator()
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert acc.device_name() == want and acc.communication_backend_name() == ("nccl" if want == "cuda" else "gloo")
    assert torch.zeros(1, device=acc.current_device_name()).device.type == want
    assert deepspeed.get_accelerator().device_name() == want  # also at the top level, as DeepSpeed exports it


@pytest.mark.parametrize("initialized, rank, ranks, logged", [
    (False, 0, None, "[Rank -1] hi"),  # no process group: always
    (True, 1, None, None),  # a group and no ranks: silent, as DeepSpeed
    (True, 1, [0], None),
    (True, 1, [0, 1], "[Rank 1] hi"),
    (True, 3, [-1], "[Rank 3] hi"),  # every rank
])
def test_log_dist_logs_where_deepspeed_does(monkeypatch, capsys, initialized, rank, ranks, logged):
    from zero_core.deepspeed.utils import logging as ds_logging

    monkeypatch.setattr(ds_logging.dist, "is_initialized", lambda: initialized)
    monkeypatch.setattr(ds_logging.dist, "get_rank", lambda: rank)
    deepspeed.utils.print_dist("hi", ranks=ranks)
    assert capsys.readouterr().out.strip() == (logged or "")


def test_see_memory_usage_reports_only_when_forced_and_repeating_loader_restarts(capsys):
    deepspeed.runtime.utils.see_memory_usage("quiet")
    assert capsys.readouterr().out == ""
    deepspeed.runtime.utils.see_memory_usage("after init", force=True)
    out = capsys.readouterr().out
    assert out.startswith("after init\n") and "CPU Virtual Memory: used = " in out
    loader = deepspeed.utils.RepeatingLoader(torch.utils.data.DataLoader(list(range(3)), batch_size=2))
    assert [next(loader).tolist() for _ in range(4)] == [[0, 1], [2], [0, 1], [2]]


@pytest.mark.parametrize("name", ["init_inference", "pipe", "PipelineModule", "moe"])
def test_deepspeeds_out_of_scope_names_say_so_in_one_line(name):
    with pytest.raises(AttributeError) as e:
        getattr(deepspeed, name)
    assert f"deepspeed.{name} is not provided by zero_core" in str(e.value) and "\n" not in str(e.value)
    assert not hasattr(deepspeed, "no_such_thing")  # anything else: a plain AttributeError


def test_get_accelerator_answers_the_memory_and_stream_calls_scripts_log():
    acc = deepspeed.accelerator.get_accelerator()
    cuda = torch.cuda.is_available()
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
        value = getattr(acc, name)()
        assert isinstance(value, int) and (value >= 0 if cuda else value == 0)
    acc.reset_peak_memory_stats()
    assert acc.total_memory() >= acc.available_memory() > 0
    t = torch.ones(3)
    assert torch.equal(acc.pin_memory(t), t) and acc.is_pinned(t) is False and acc.on_accelerator(t) is (not cuda)
    with acc.stream(acc.current_stream()):
        assert (acc.Stream is None) is (not cuda)
    with pytest.raises(AttributeError, match=r"^get_accelerator\(\)\.get_op_builder is not provided by zero_core's"):
        acc.get_op_builder("CPUAdamBuilder")  # DeepSpeed's compiled ops are not part of zero_core
