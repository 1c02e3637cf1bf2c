"""`deepspeed.checkpointing.configure(checkpoint_in_cpu=True)`, or the config's
`"activation_checkpointing": {"cpu_checkpointing": true}` given as `configure(deepspeed_config=...)`: a checkpoint
keeps host copies of its floating-point tensor arguments from forward to backward, not the tensors themselves, and
the gradients are bit for bit those of the same block run without checkpointing. On a CPU-only machine `.to("cpu")`
is the tensor itself, so where it matters the device-to-host copy is faked by a forced copy (`_to_host`), and what
torch's checkpoint holds is seen by hooking it. The block, input and upstream gradient are those DeepSpeed 0.19.8's
run recorded (tests/fixtures/deepspeed_cpu_checkpointing.json, made by tests/fixtures/make_cpu_checkpointing.py;
there its own cpu_checkpointing empties the input and its backward fails on the CPU)."""

from __future__ import annotations

import gc
import json
import weakref

import pytest
import torch
import torch.utils.checkpoint

from helpers import FIXTURES, fixture_script
from zero_core.deepspeed import checkpointing

MAKE = fixture_script("make_cpu_checkpointing")
DEEPSPEED = json.loads((FIXTURES / "deepspeed_cpu_checkpointing.json").read_text())


@pytest.fixture(autouse=True)
def _defaults():
    yield
    checkpointing.configure(None)  # the module's settings are process-wide: back to DeepSpeed's defaults


@pytest.fixture
def held(monkeypatch):
    """The tensors torch's checkpoint is given (and holds until backward), call by call."""
    calls: list[list[torch.Tensor]] = []
    real = torch.utils.checkpoint.checkpoint

    def spy(function, *args, **kwargs):
        calls.append([a for a in args if isinstance(a, torch.Tensor)])
        return real(function, *args, **kwargs)

    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", spy)
    return calls


@pytest.fixture
def host_copies(monkeypatch):
    """A device whose host copy is other memory, as a GPU's is: every copy `_to_host` makes, in order."""
    made: list[torch.Tensor] = []

    def copy(tensor):
        made.append(tensor.detach().to("cpu", copy=True))
        return made[-1]

    monkeypatch.setattr(checkpointing, "_to_host", copy)
    return made


def _grads(block, x) -> list[torch.Tensor]:
    return [p.grad for p in block.parameters()] + [x.grad]


def _plain() -> list[torch.Tensor]:
    block, x, upstream = MAKE.block_and_input()
    block(x * 2).backward(upstream)
    return _grads(block, x)


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(u, v) for u, v in zip(a, b, strict=True))


def test_the_checkpoint_holds_host_copies_and_lets_the_activation_go(held, host_copies):
    checkpointing.configure(None, checkpoint_in_cpu=True)
    block, x, upstream = MAKE.block_and_input()
    h = x * 2
    gone = weakref.ref(h)
    out = checkpointing.checkpoint(block, h)
    (kept,) = held
    assert kept[0] is host_copies[0] and kept[0].device.type == "cpu" and kept[0].data_ptr() != h.data_ptr()
    assert list(h.shape) == [3, 6]  # the caller's tensor is left whole (DeepSpeed's is emptied until backward)
    del h
    gc.collect()
    assert gone() is None  # nothing held the activation itself until backward
    out.backward(upstream)
    assert _same(_grads(block, x), _plain())


def test_the_recomputation_reads_the_host_copies(host_copies):
    """The caller's tensor overwritten after the forward: a checkpoint that recomputed from it would differ."""
    checkpointing.configure(None, checkpoint_in_cpu=True)
    block, x, upstream = MAKE.block_and_input()
    h = x * 2
    out = checkpointing.checkpoint(block, h)
    h.data.fill_(float("nan"))
    out.backward(upstream)
    assert len(host_copies) == 1 and _same(_grads(block, x), _plain())


@pytest.mark.parametrize("how", ["checkpoint_in_cpu", "config dict", "config file", "non_reentrant"])
def test_gradients_are_bitwise_unchanged_with_keywords_and_other_arguments(tmp_path, held, how):
    """No faked copy: the module's own host copy, keyword tensors and non-tensor arguments, each way to turn it on."""
    config = {"train_micro_batch_size_per_gpu": 2, "activation_checkpointing": {"cpu_checkpointing": True}}
    (tmp_path / "ds.json").write_text("// comments, as DeepSpeed's reader takes them\n" + json.dumps(config))
    settings = {"config dict": {"deepspeed_config": config}, "config file": {"deepspeed_config": tmp_path / "ds.json"}}
    checkpointing.configure(None, **settings.get(how, {"checkpoint_in_cpu": True}))

    def run(on_host: bool):
        block, x, upstream = MAKE.block_and_input()
        shift = torch.full((6,), 0.5, requires_grad=True)

        def layer(t, times, shift):
            return block(t * times + shift)

        h = x * 2
        if not on_host:
            out = layer(h, 3, shift)
        elif how == "non_reentrant":
            out = checkpointing.non_reentrant_checkpoint(lambda t, s: layer(t, 3, s), h, shift)
        else:
            out = checkpointing.checkpoint(layer, h, 3, shift=shift)
        out.backward(upstream)
        return [*_grads(block, x), shift.grad], h, shift

    want, *_ = run(on_host=False)
    got, h, shift = run(on_host=True)
    assert _same(got, want)
    (kept,) = held
    assert kept[0] is not h and kept[1] is not shift and all(t.device.type == "cpu" for t in kept)


def test_gradients_match_deepspeeds_checkpoint_and_no_grad_copies_nothing(host_copies):
    checkpointing.configure(None, checkpoint_in_cpu=True)
    block, x, upstream = MAKE.block_and_input()
    checkpointing.checkpoint(block, x * 2).backward(upstream)
    for name, got in zip([*dict(block.named_parameters()), "x"], _grads(block, x)):
        want = torch.tensor(DEEPSPEED["checkpoint_only"]["grads"][name])
        assert torch.allclose(got.flatten(), want, rtol=0, atol=1e-6), name
    with torch.no_grad():
        checkpointing.checkpoint(block, x)
    assert len(host_copies) == 1  # nothing is kept for a backward that will not run


def test_configure_starts_from_the_defaults_and_a_wrong_value_is_one_line(tmp_path):
    checkpointing.configure(None, checkpoint_in_cpu=True)
    checkpointing.configure(None)  # as DeepSpeed's: each call starts from the defaults
    assert not checkpointing._cpu_checkpoint
    for bad in ({"activation_checkpointing": {"cpu_checkpointing": "yes"}}, {"activation_checkpointing": True}):
        with pytest.raises(ValueError, match="cpu_checkpointing") as e:
            checkpointing.configure(None, deepspeed_config=bad)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="checkpoint_in_cpu") as e:
        checkpointing.configure(None, checkpoint_in_cpu=1)
    assert "\n" not in str(e.value)
