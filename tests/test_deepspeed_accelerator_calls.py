"""`get_accelerator()`'s less common calls answer as DeepSpeed 0.19.8's CPU accelerator does on this machine
(`DS_ACCELERATOR=cpu`), or as its CUDA accelerator where there is a GPU; it is one object, as DeepSpeed's."""

from __future__ import annotations

import pytest
import torch

from zero_core.deepspeed.accelerator import get_accelerator

CUDA = torch.cuda.is_available()


def test_accelerator_is_one_object_and_seeds_torchs_generators():
    acc = get_accelerator()
    assert get_accelerator() is acc
    assert isinstance(acc.manual_seed(7), torch.Generator) and acc.initial_seed() == 7
    state = acc.get_rng_state()
    first = torch.rand(2, device=acc.device_name())
    acc.set_rng_state(state)
    assert torch.equal(torch.rand(2, device=acc.device_name()), first)
    assert acc.random() is torch.random


@pytest.mark.skipif(CUDA, reason="the CPU accelerator's answers")
def test_cpu_answers_as_deepspeeds_cpu_accelerator():
    acc = get_accelerator()
    # DeepSpeed 0.19.8's CPU accelerator on this machine
    assert acc.is_synchronized_device() and acc.use_host_timers() and acc.resolves_data_dependency()
    assert acc.handles_memory_backpressure() and acc.is_triton_supported() is False and acc.device(0) is None
    fp16 = [torch.float16] if torch.ops.mkldnn._is_mkldnn_fp16_supported() else []  # as DeepSpeed's: this CPU's
    assert acc.supported_dtypes() == [torch.float32, torch.bfloat16, *fp16]
    assert acc.FloatTensor is torch.FloatTensor and acc.LongTensor is torch.LongTensor
    assert acc.BFloat16Tensor is torch.BFloat16Tensor
    assert acc.lazy_call(lambda: 5) == 5 and acc.visible_devices_envs() == ["CUDA_VISIBLE_DEVICES"]
    assert acc.export_envs() == [] and acc.memory_stats() == {} and acc.create_graph() is None
    with acc.capture_to_graph(None):
        acc.range_push("region")
        acc.range_pop()
    env: dict = {}
    acc.set_visible_devices_envs(env, [0, 1])
    assert env == {"CUDA_VISIBLE_DEVICES": "0,1"}


def test_compile_backend_is_checked_and_kept():
    acc = get_accelerator()
    assert acc.get_compile_backend() == "inductor"
    with pytest.raises(ValueError, match="is not a torch.compile backend here"):
        acc.set_compile_backend("no_such_backend")
    acc.set_compile_backend("eager")
    try:
        assert get_accelerator().get_compile_backend() == "eager"
    finally:
        acc.set_compile_backend("inductor")
