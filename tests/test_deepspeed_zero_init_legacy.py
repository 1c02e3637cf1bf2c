"""Models built inside `deepspeed.zero.Init` the old ways, and under configs below stage 3, come out as DeepSpeed
0.19.8's zero.Init builds them. Compared with real DeepSpeed's run of tests/fixtures/make_zero_init_legacy.py (its
`Net`: the legacy `torch.Tensor(out, in)`, `torch.FloatTensor` / `torch.DoubleTensor` parameters, `torch.rand`,
integer-`arange` and `torch.tensor` parameters, `new_empty` on a parameter and a parent's `apply` over a finished
child; fixtures in tests/fixtures/deepspeed_zero_init_legacy/, one CPU rank) under bf16 and fp32: the dtypes inside
the context, the initial fp32 masters bitwise and three steps' losses within 1e-5, whatever stage the config given
to zero.Init names (DeepSpeed's zero.Init does not read it).

At stage 1 or 2 DeepSpeed's engine fails at the first forward of a zero.Init model (the fixture's `below_stage3`:
its parameters stay partitioned); zero_core's trains it, from DeepSpeed's construction."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import zero_core

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
import make_zero_init_legacy as legacy  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "deepspeed_zero_init_legacy"
REFERENCE = json.loads((FIXTURES / "reference.json").read_text())
MASTERS = load_file(str(FIXTURES / "masters.safetensors"))


def _check_against_deepspeed(got: dict, precision: str, init: str) -> None:
    want = REFERENCE["runs"][f"{precision}.{init}"]
    for name, value in got["initial"].items():
        assert torch.equal(value, MASTERS[f"{precision}.{name}"]), f"initial master {name}"
    assert got["losses"] == pytest.approx(want["losses"], abs=1e-5)


@pytest.mark.parametrize("init", legacy.INIT_CONFIGS)
@pytest.mark.parametrize("precision", legacy.PRECISIONS)
def test_an_old_style_model_builds_and_trains_as_deepspeeds(precision, init):
    import zero_core.deepspeed as deepspeed

    got = legacy.run(deepspeed, precision, init)
    assert got["inside"] == REFERENCE["runs"][f"{precision}.{init}"]["inside"]
    _check_against_deepspeed(got, precision, init)


@pytest.mark.parametrize("stage", [1, 2])
def test_below_stage_3_a_zero_init_model_trains_from_deepspeeds_construction(stage):
    import zero_core.deepspeed as deepspeed

    assert REFERENCE["below_stage3"].startswith("the first forward: ")  # what DeepSpeed does instead
    got = legacy.run(deepspeed, "bf16", f"stage{stage}", train_stage=stage)  # zero.Init and initialize: one config
    _check_against_deepspeed(got, "bf16", "stage3")


def test_the_legacy_constructor_inside_the_context_and_after():
    """Inside: `torch.Tensor(*sizes)` is zero.Init's dtype on the meta device (DeepSpeed: that dtype), its data form
    is torch's (DeepSpeed's raises), typed constructors keep their dtype. After: torch's own, and the module classes'
    own `__init__`s, also when construction raised."""
    from zero_core.deepspeed import zero

    init_of = {cls: cls.__dict__["__init__"] for cls in (torch.nn.Module, torch.nn.Linear, legacy.OldStyleLinear)}
    with pytest.raises(RuntimeError, match="raised inside"):
        with zero.Init(config_dict_or_path=legacy.config("bf16", 3)):
            made = {"sizes": torch.Tensor(4, 8), "none": torch.Tensor(), "size": torch.Tensor(torch.Size([2, 3])),
                    "data": torch.Tensor([1.0, 2.0]), "typed": torch.FloatTensor(3)}
            raise RuntimeError("raised inside")
    assert {k: (t.dtype, t.device.type, tuple(t.shape)) for k, t in made.items()} == {
        "sizes": (torch.bfloat16, "meta", (4, 8)), "none": (torch.bfloat16, "meta", (0,)),
        "size": (torch.bfloat16, "meta", (2, 3)), "data": (torch.float32, "cpu", (2,)),
        "typed": (torch.float32, "cpu", (3,))}
    assert torch.equal(made["data"], torch.tensor([1.0, 2.0]))
    after = torch.Tensor(4, 8)
    assert (after.dtype, after.device.type) == (torch.float32, "cpu")
    assert "__new__" not in torch.Tensor.__dict__ and "__init_subclass__" not in torch.nn.Module.__dict__
    assert all(cls.__dict__["__init__"] is init for cls, init in init_of.items())


class _DataParameters(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.Tensor(5, 3))
        torch.nn.init.normal_(self.weight)
        self.scale = torch.nn.Parameter(torch.FloatTensor(5))
        torch.nn.init.uniform_(self.scale)
        self.bias = torch.nn.Parameter(torch.tensor([0.1, -0.2, 0.3, 0.0, 0.5]))
        self.temperature = torch.nn.Parameter(torch.tensor(0.07))  # 0-dim: DeepSpeed's zero.Init refuses it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x @ self.weight.t() * self.scale + self.bias) / self.temperature


def test_init_context_records_legacy_and_data_parameters_as_eager_construction():
    """Legacy-constructor and `torch.tensor` parameters are recorded too, so `zero_core.init_context` gives them
    eager construction's fp32 values (bitwise) under a bf16 config, and they train."""
    import zero_core.deepspeed as deepspeed

    cfg = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3}, "bf16": {"enabled": True},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    torch.manual_seed(0)
    eager = _DataParameters()
    torch.manual_seed(0)
    with zero_core.init_context(cfg):
        model = _DataParameters()
    assert {p.device.type for p in model.parameters()} == {"meta"}
    engine, *_ = deepspeed.initialize(model=model, config=cfg)
    for name, want in eager.named_parameters():
        assert torch.equal(deepspeed.utils.safe_get_full_fp32_param(getattr(model, name)), want.detach()), name
    engine.backward(engine(torch.ones(2, 3, dtype=torch.bfloat16)).float().pow(2).mean())
    engine.step()
    engine.close()


@pytest.mark.parametrize("config, problem", [
    (42, "must be a DeepSpeed config .* not int; pass one of those"),
    ({"zero_optimization": {"stage": 7}}, "zero_optimization.stage must be an integer 0-3"),
    ("no/such/ds_config.json", "does not exist; pass the path of a DeepSpeed-style JSON file"),
])
def test_a_config_zero_init_cannot_read_is_refused_in_one_line(config, problem):
    """Whatever stage it names, zero.Init reads the config, and refuses one it cannot read before recording."""
    import zero_core.deepspeed as deepspeed

    with pytest.raises(ValueError, match=problem):
        deepspeed.zero.Init(config_dict_or_path=config)
