"""The engine's DeepSpeed-style surface: module.state_dict() is current or refuses (stage 3 never hands out
stale weights), GatheredParameters reads and rewrites whole weights, save_16bit_model writes the current
weights at every stage (from_pretrained opens a transformers model's folder), and what zero_core does not
support is refused by name."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

import zero_core
import zero_core.deepspeed as deepspeed
from dist_harness import run_ranks
from parity_workers import ds_config, make_batches, make_model

pytestmark = pytest.mark.slow  # spawned ranks or whole runs: outside the fast tier (-m 'not slow')


def _trained(stage: int, world: int, rank: int = 0, steps: int = 3, dtype: str = "fp32"):
    engine = zero_core.initialize(make_model(), ds_config(stage, dtype, 2, stage3_param_persistence_threshold=0))
    for x, y in make_batches(steps, 2 * world):
        engine.backward(engine(x[rank * 2 : rank * 2 + 2], y[rank * 2 : rank * 2 + 2]).loss)
        engine.step()
    return engine


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_module_state_dict_is_current_on_one_rank(stage):
    engine = _trained(stage, 1)
    current, full = engine.module.state_dict(), engine.full_state_dict()
    assert all(torch.equal(current[k].float(), full[k]) for k in full)


def _state_dict_at_stage_3(rank: int, world: int) -> dict:
    engine = _trained(3, world, rank)
    try:
        engine.module.state_dict()
        refused = None
    except ValueError as e:
        refused = str(e)
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
        gathered = {k: v.float().clone() for k, v in engine.module.state_dict().items()}
    return {"refused": refused, "gathered": gathered, "full": engine.full_state_dict()}


def test_stage_3_state_dict_refuses_on_several_ranks_and_is_current_when_gathered():
    got = run_ranks(_state_dict_at_stage_3, 2)
    assert "at ZeRO stage 3 on 2 ranks" in got["refused"] and "full_state_dict" in got["refused"]
    assert "\n" not in got["refused"]
    assert all(torch.equal(got["gathered"][k], got["full"][k]) for k in got["full"])


def _modify(rank: int, world: int, stage: int) -> dict:
    engine = _trained(stage, world, rank, steps=2)
    name, weight = next(
        (n, p) for n, p in engine.module.named_parameters() if n.startswith("blocks.0.") and p.dim() == 2
    )
    with deepspeed.zero.GatheredParameters([weight], modifier_rank=0):
        if rank == 0:
            weight.data.fill_(0.25)
    state = engine.full_state_dict()
    losses = []
    for x, y in make_batches(2, 2 * world):  # training goes on from the modified weights
        loss = engine(x[rank * 2 : rank * 2 + 2], y[rank * 2 : rank * 2 + 2]).loss
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    return {"name": name, "state": state, "losses": losses}


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_gathered_parameters_with_a_modifier_rewrites_the_master_weights(stage):
    got = run_ranks(_modify, 2, stage)
    assert torch.equal(got["state"][got["name"]], torch.full_like(got["state"][got["name"]], 0.25))
    assert all(torch.isfinite(torch.tensor(got["losses"])))


def _saved_16bit(rank: int, world: int, stage: int, out: str) -> dict:
    engine = _trained(stage, world, rank, dtype="bf16")
    assert engine.save_16bit_model(out) is True  # DeepSpeed's default name, pytorch_model.bin
    assert engine.save_16bit_model(out, "model.safetensors") is True
    return engine.full_state_dict()


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_save_16bit_model_writes_the_current_weights(tmp_path, stage):
    full = run_ranks(_saved_16bit, 2, stage, str(tmp_path))
    saved = load_file(str(tmp_path / "model.safetensors"))
    assert "head.weight" not in saved and "wte.weight" in saved  # tied: stored once, under its first name
    pickled = torch.load(tmp_path / "pytorch_model.bin", weights_only=True)  # plain tensors, as DeepSpeed's
    assert pickled.keys() == full.keys() and pickled["head.weight"] is pickled["wte.weight"]  # tied: one tensor
    assert all(torch.equal(pickled[k], t) for k, t in saved.items())
    for k, t in saved.items():
        assert t.dtype == (torch.bfloat16 if full[k].is_floating_point() else full[k].dtype), k
        assert torch.equal(t, full[k].to(t.dtype)), k


def test_save_16bit_model_of_a_transformers_model_opens_with_from_pretrained(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    engine = zero_core.initialize(model, {**ds_config(3, "fp32", 2), "gradient_clipping": 1.0})
    ids = torch.randint(0, 64, (2, 16))
    for _ in range(2):
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        engine.step()
    engine.save_16bit_model(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path))
    full = engine.full_state_dict()
    assert all(torch.equal(v, full[k]) for k, v in loaded.state_dict().items())


@pytest.mark.parametrize(
    "call,expected",
    [
        (lambda e: e.load_checkpoint("x", custom_load_fn=print), "custom_load_fn"),
        (lambda e: e.train_batch(), "pipeline parallelism"),
        (lambda e: deepspeed.initialize(model=make_model(), config=ds_config(2, "fp32", 2), mpu=object()), "mpu="),
        (lambda e: e.client_optimizer.step(), "engine.step()"),
    ],
)
def test_what_zero_core_does_not_do_is_refused_by_name(call, expected):
    engine = zero_core.initialize(make_model(), ds_config(2, "fp32", 2))
    with pytest.raises((NotImplementedError, RuntimeError)) as e:
        call(engine)
    assert expected in str(e.value) and "\n" not in str(e.value)


def test_deepspeed_initialize_returns_what_deepspeed_returns():
    model = make_model()
    engine, optimizer, loader, scheduler = deepspeed.initialize(
        model=model,
        model_parameters=model.parameters(),
        training_data=torch.utils.data.TensorDataset(torch.arange(8)),
        config={**ds_config(2, "fp32", 2), "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 5}}},
    )
    assert isinstance(engine, torch.nn.Module) and engine.module is model
    assert isinstance(optimizer, torch.optim.Optimizer) and optimizer.param_groups[0]["params"][0] is model.wte.weight
    assert len(next(iter(loader))[0]) == 2 and scheduler.get_last_lr() == engine.get_lr()
    assert (
        engine.train_batch_size(),
        engine.train_micro_batch_size_per_gpu(),
        engine.gradient_accumulation_steps(),
        engine.zero_optimization_stage(),
        engine.global_steps,
    ) == (2, 2, 1, 2, 0)
