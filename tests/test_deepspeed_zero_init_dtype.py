"""A model built inside `deepspeed.zero.Init` takes the dtype DeepSpeed 0.19.8's zero.Init gives it: bf16 under a
bf16 config (fp16 under fp16, fp32 otherwise; the `dtype` argument or the accelerator without a config), with
the weight initialisation run in that dtype and the fp32 masters starting from those values. Compared with real
DeepSpeed's run of tests/zero_init_bf16_script.py (tests/fixtures/deepspeed_zero_init/, made on the CPU by
tests/fixtures/make_zero_init_bf16_fixtures.py) on 1 and 2 gloo ranks: the dtypes inside the context and after
initialize, the initial masters bitwise, the losses of three steps within 2e-6 and the masters after them within
1e-6 (DeepSpeed's torch AdamW and zero_core's may round an update an fp32 ulp apart).

`zero_core.init_context` keeps eager construction's fp32 values under any config (zbench compares engines from
identical initial weights)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import zero_core
import zero_init_bf16_script
from dist_harness import run_ranks

FIXTURES = Path(__file__).parent / "fixtures" / "deepspeed_zero_init"
REFERENCE = json.loads((FIXTURES / "reference.json").read_text())["worlds"]
STAGE3 = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}


def _train(rank: int, world: int) -> dict:
    import zero_core.deepspeed as deepspeed

    return zero_init_bf16_script.run(deepspeed, rank, world)


@pytest.mark.parametrize("world", [1, 2])
def test_zero_init_under_bf16_trains_as_deepspeeds(world):
    want, got = REFERENCE[str(world)], run_ranks(_train, world)
    masters = load_file(str(FIXTURES / "masters.safetensors"))
    assert got["inside"] == want["inside"]
    assert got["params_after"] == want["params_after"]
    for name, value in got["initial"].items():
        assert torch.equal(value, masters[f"world{world}.initial.{name}"]), f"initial master {name}"
    assert got["losses"] == pytest.approx(want["losses"], abs=2e-6)
    for name, value in got["final"].items():
        diff = float((value - masters[f"world{world}.final.{name}"]).abs().max())
        assert diff < 1e-6, f"master {name} after the steps is {diff:.3g} from DeepSpeed's"


def _built(**init_args) -> torch.nn.Module:
    from zero_core.deepspeed import zero

    with zero.Init(**init_args):
        return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))


@pytest.mark.parametrize("config, dtype", [
    ({**STAGE3, "bf16": {"enabled": True}}, torch.bfloat16),
    ({**STAGE3, "bfloat16": {"enabled": True}}, torch.bfloat16),  # DeepSpeed's older name
    ({**STAGE3, "fp16": {"enabled": True}}, torch.float16),
    ({**STAGE3, "bf16": {"enabled": False}}, torch.float32),
])
def test_parameters_take_the_configs_precision_inside_the_context(config, dtype):
    model = _built(config_dict_or_path=config)
    assert {p.dtype for p in model.parameters()} == {dtype}


def test_without_a_config_the_dtype_follows_the_accelerator():
    """DeepSpeed: `dtype` (fp16 when None) where the accelerator supports fp16, else bf16 (this CPU, or any
    accelerator without fp16) whatever `dtype` says; a config with a dtype argument reads the same way."""
    from zero_core.deepspeed.accelerator import get_accelerator

    gpu = get_accelerator().is_fp16_supported()
    assert {p.dtype for p in _built().parameters()} == {torch.float16 if gpu else torch.bfloat16}
    model = _built(config_dict_or_path={**STAGE3, "bf16": {"enabled": True}}, dtype=torch.float32)
    assert {p.dtype for p in model.parameters()} == {torch.float32 if gpu else torch.bfloat16}


def test_a_config_enabling_both_precisions_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^deepspeed.zero.Init: the config enables both bf16 and fp16; .*$"):
        _built(config_dict_or_path={**STAGE3, "bf16": {"enabled": True}, "fp16": {"enabled": True}})


def test_init_context_keeps_eager_fp32_values_under_bf16():
    import zero_core.deepspeed as deepspeed

    cfg = {**STAGE3, "bf16": {"enabled": True}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}

    def build() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Linear(8, 8)

    eager = build()
    with zero_core.init_context(cfg):
        model = build()
    assert model.weight.dtype == torch.float32
    engine, *_ = deepspeed.initialize(model=model, config=cfg)
    for p, want in zip(model.parameters(), eager.parameters()):
        assert torch.equal(deepspeed.utils.safe_get_full_fp32_param(p), want.detach())
    engine.close()


class _WithBuffers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, 4, 2).float() / 4)))  # computed: fp32
        self.register_buffer("noise", torch.randn(2))  # a converted factory's: bf16

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).float().pow(2).mean() + self.inv_freq.sum() * 0


def test_buffers_keep_the_dtypes_construction_gave_them_after_initialize():
    """DeepSpeed's engine leaves a zero.Init model's buffers as they were made: a rotary table computed in fp32
    stays fp32 under bf16 (zero_core.init_context's models take the working precision instead)."""
    import zero_core.deepspeed as deepspeed

    cfg = {**STAGE3, "bf16": {"enabled": True}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    with deepspeed.zero.Init(config_dict_or_path=cfg):
        model = _WithBuffers()
    engine, *_ = deepspeed.initialize(model=model, config=cfg)
    assert {n: b.dtype for n, b in engine.module.named_buffers()} == {"inv_freq": torch.float32,
                                                                      "noise": torch.bfloat16}
    engine.backward(engine(torch.randn(1, 4, dtype=torch.bfloat16)))
    engine.step()
    engine.close()


@pytest.mark.parametrize("precision, dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
@pytest.mark.parametrize("stage", [1, 3])
def test_a_model_built_outside_zero_init_starts_from_its_16_bit_weights(precision, dtype, stage):
    """DeepSpeed 0.19.8 casts the module to its 16-bit dtype before copying the fp32 masters from it: its masters
    start from the rounded weights (seen on the CPU at stages 1-3 under bf16), and so do the drop-in's."""
    import zero_core.deepspeed as deepspeed

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    rounded = [p.detach().to(dtype).float() for p in net.parameters()]
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": stage}, precision: {"enabled": True},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=cfg)
    masters = [deepspeed.utils.safe_get_full_fp32_param(p) for p in net.parameters()]
    assert all(torch.equal(m, r) for m, r in zip(masters, rounded))
    engine.close()
