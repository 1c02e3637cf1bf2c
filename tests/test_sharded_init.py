"""Sharded initialisation: a model built inside zero_core.init_context is never whole on any rank, and its
initial weights are bitwise those of eager construction with the same seed, at any world size."""

from __future__ import annotations

import pytest
import torch

import zero_core
from dist_harness import run_ranks
from init_workers import LARGE, build, large_under_limit, seeds_only_on_rank1, sharded_state
from zbench.models.gpt import GPT, GPTConfig

pytestmark = pytest.mark.slow  # spawned ranks or whole runs: outside the fast tier (-m 'not slow')


def _eager(kind: str) -> tuple[dict, torch.Tensor]:
    torch.manual_seed(100)  # rank 0's seed in sharded_state
    model = build(kind)
    return model.state_dict(), torch.randn(4)


@pytest.mark.gpu
@pytest.mark.parametrize("kind,world,stage", [("gpt", 2, 3), ("gpt", 1, 3), ("gpt", 2, 2), ("gpt2", 2, 3),
                                              ("blenderbot", 2, 3)])
def test_initial_weights_equal_eager_construction(kind, world, stage):
    """gpt2 and blenderbot are Hugging Face models; blenderbot's embeddings are tied four ways and stay tied.
    On GPUs (ZB_TEST_DEVICE=cuda) the random state construction began from crosses NCCL through the GPU."""
    if kind != "gpt":
        pytest.importorskip("transformers")
    got = run_ranks(sharded_state, world, kind, stage)
    want, after = _eager(kind)
    assert got["on_meta"] == (stage == 3)  # at stage 3 nothing was materialised while building
    assert set(got["state"]) == set(want)
    assert [k for k in want if not torch.equal(got["state"][k], want[k])] == []
    assert torch.equal(got["after"], after)  # the random stream goes on as after eager construction
    assert got["loss"] == got["loss"]  # trained a step (finite)
    assert got["tied"] == (kind == "blenderbot")


@pytest.mark.slow
def test_large_model_never_whole_on_a_rank(tmp_path, monkeypatch):
    monkeypatch.setenv("ZERO_CORE_NVME_CHUNK_NUMEL", str(1 << 18))
    # freed blocks go back to the system at once, so the resident set measures what is held, not what glibc kept
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    got = run_ranks(large_under_limit, 2, str(tmp_path), fresh=True)  # glibc reads MALLOC_* at process start
    allowed = got["fp32_bytes"]  # one rank may not hold the fp32 model
    assert got["init_growth"] < allowed, got
    assert got["growth"] < allowed, got
    assert all(loss == loss for loss in got["losses"])
    assert got["layout_numel"] * 2 >= LARGE.num_params()


def test_stage_below_3_builds_normally():
    with zero_core.init_context({"zero_optimization": {"stage": 2}}):
        layer = torch.nn.Linear(4, 4)
    assert layer.weight.device.type == "cpu"


def test_deepspeed_init_accepts_deepspeed_arguments():
    from zero_core.deepspeed import zero

    with zero.Init(config_dict_or_path={"zero_optimization": {"stage": 3}}, remote_device="cpu", pin_memory=True,
                   dtype=torch.bfloat16):
        layer = torch.nn.Linear(4, 4)
    assert layer.weight.device.type == "meta"
    with zero.Init(enabled=False):
        assert torch.nn.Linear(2, 2).weight.device.type == "cpu"


def test_parameters_built_under_zero_init_say_their_full_size():
    """As under DeepSpeed's zero.Init, `ds_numel` and `ds_shape` (scripts count the model with them), from
    construction on and still once `initialize` has sharded the model. No `ds_id` from zero.Init nor from
    zero_core.initialize: `deepspeed.initialize` gives it at stage 3, with a live `ds_status`
    (tests/test_deepspeed_shim_modules.py)."""
    from zero_core.deepspeed import zero

    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    shape = GPTConfig(vocab_size=64, block_size=8, n_layer=2, n_head=2, n_embd=16)
    want = {n: p.shape for n, p in GPT(shape).named_parameters()}
    with zero.Init(config_dict_or_path=cfg):
        model = GPT(shape)
    engine = None
    for stage in ("built", "initialized"):
        assert {n: p.ds_shape for n, p in model.named_parameters()} == want, stage
        assert sum(p.ds_numel for p in model.parameters()) == sum(s.numel() for s in want.values()), stage
        assert not any(hasattr(p, "ds_id") for p in model.parameters())
        assert stage == "initialized" or not any(hasattr(p, "ds_status") for p in model.parameters())
        engine = engine or zero_core.initialize(model, cfg)
    engine.close()


def test_meta_model_gets_each_modules_own_initialisation():
    """Built on the meta device without init_context: each module's reset_parameters runs, in module order
    (for a model of leaf layers that is the order eager construction initialised them in)."""
    def build():
        return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 3))

    torch.manual_seed(3)
    want = build().state_dict()
    torch.manual_seed(3)
    with torch.device("meta"):
        model = build()
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    got = zero_core.initialize(model, cfg).full_state_dict()
    assert [k for k in want if not torch.equal(got[k], want[k])] == []


def test_replay_holds_about_one_tensor_at_a_time():
    """The minGPT-style model fills every weight in __init__ and again in apply(_init): replay still holds
    little more than the largest tensor at once (not the model)."""
    from zero_core.deferred import materialiser

    torch.manual_seed(0)
    with zero_core.init_context():
        model = GPT(GPTConfig(vocab_size=64, block_size=8, n_layer=12, n_head=4, n_embd=128))
    sizes = [p.numel() * 4 for p in model.parameters()]
    source = materialiser(model, torch.device("cpu"))
    source.run(lambda p, value: None)
    assert source.peak_bytes <= 2 * max(sizes) < sum(sizes) / 10


def test_partial_offload_to_nvme_takes_sharded_initialisation(tmp_path, monkeypatch):
    """offload_optimizer.ratio < 1 with NVMe states: the host part's chunks (offset by the split, a grid of their
    own) are filled from the assembler's and written whole; training equals the eagerly built model's, bitwise."""
    monkeypatch.setenv("ZERO_CORE_NVME_CHUNK_NUMEL", "1000")  # many host chunks across one assembly chunk
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 1.0,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
           "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": str(tmp_path),
                                                                   "ratio": 0.45}}}

    def train(sharded: bool) -> tuple[dict, list[float]]:
        torch.manual_seed(7)
        if sharded:
            with zero_core.init_context(cfg):
                model = build("gpt")
        else:
            model = build("gpt")
        engine = zero_core.initialize(model, cfg)
        start, losses = engine.full_state_dict(), []
        for step in range(2):
            x = torch.randint(0, 96, (1, 8), generator=torch.Generator().manual_seed(step)).to(engine.device)
            loss = engine(x, x).loss
            engine.backward(loss)
            engine.step()
            losses.append(float(loss.detach()))
        engine.close()
        return start, losses

    (eager_start, eager_losses), (start, losses) = train(False), train(True)
    assert [k for k in eager_start if not torch.equal(start[k], eager_start[k])] == []
    assert losses == eager_losses


def test_seeds_set_inside_the_context_are_replayed():
    """`torch.manual_seed` called while the model is being built (once before it, once between two modules) seeds
    the replayed weights as it seeded eager construction; the random stream goes on as after eager construction."""
    def make() -> torch.nn.Module:
        torch.manual_seed(11)
        first = torch.nn.Linear(8, 8)
        torch.manual_seed(12)
        return torch.nn.Sequential(first, torch.nn.Linear(8, 4))

    torch.manual_seed(0)
    want, after = make().state_dict(), torch.randn(3)
    torch.manual_seed(99)  # a different state when the context starts: only the seeds inside decide
    with zero_core.init_context({"zero_optimization": {"stage": 3}}):
        model = make()
    engine = zero_core.initialize(model, {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}})
    got = engine.full_state_dict()
    engine.close()
    assert [k for k in want if not torch.equal(got[k], want[k])] == []
    assert torch.equal(torch.randn(3), after)


def test_ranks_that_seed_differently_while_building_get_one_clear_error():
    got = run_ranks(seeds_only_on_rank1, 2)
    assert got["error"] is not None and "\n" not in got["error"]
    assert "set the random seed [0, 1] times" in got["error"] and "the same way on every rank" in got["error"]
