"""`deepspeed.profiling.flops_profiler`: get_model_profile and FlopsProfiler give DeepSpeed 0.19.8's MACs and parameters
for small models, and its flops where the counting rules agree (matrix products); DeepSpeed also counts elementwise
work (activations, norms, softmax) as flops, which FlopCounterMode does not: the tests name that difference.
DeepSpeed's numbers: tests/fixtures/make_deepspeed_small_utils.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers import fixture_script
from zero_core.deepspeed.profiling.flops_profiler import (FlopsProfiler, get_model_profile, get_module_flops,
                                                          get_module_macs, number_to_string, params_to_string)

FIXTURES = Path(__file__).resolve().parent / "fixtures"
REF = json.loads((FIXTURES / "deepspeed_small_utils.json").read_text())["profiles"]
MAKER = fixture_script("make_deepspeed_small_utils")

# flops DeepSpeed adds for elementwise work (none of them MACs): per model, and per child module
ELEMENTWISE = {"linear_chain": 0, "mlp_relu": 4 * 32,  # ReLU: one per element of its (4, 32) output
               "attention": 2 * 5 * 5,  # softmax over the (2, 5, 5) scores
               "block": 2 * 5 * 2 * 5 * 16 + 2 * 5 * 64}  # two LayerNorms (5 per element) and the MLP's GELU
CHILD_ELEMENTWISE = {"mlp_relu": {"1": 128}, "block": {"norm1": 800, "norm2": 800, "mlp": 640}}


@pytest.mark.parametrize("name", list(MAKER.MODELS))
def test_get_model_profile_numbers_are_deepspeeds_but_elementwise_flops(name):
    ref = REF[name]
    flops, macs, params = get_model_profile(MAKER.build(name), input_shape=MAKER.MODELS[name], print_profile=False,
                                            as_string=False)
    assert (macs, params) == (ref["macs"], ref["params"])
    assert flops == ref["flops"] - ELEMENTWISE[name]
    strings = get_model_profile(MAKER.build(name), input_shape=MAKER.MODELS[name], print_profile=False)
    assert strings[1:] == tuple(ref["strings"][1:])
    assert strings[0] == number_to_string(flops)
    if ELEMENTWISE[name] == 0:
        assert list(strings) == ref["strings"]


@pytest.mark.parametrize("name", list(MAKER.MODELS))
def test_flops_profiler_counts_each_module_as_deepspeed(name):
    model = MAKER.build(name)
    prof = FlopsProfiler(model)
    prof.start_profile()
    model(torch.randn(MAKER.MODELS[name]))
    for child, (flops, macs, params) in REF[name]["children"].items():
        module = model.get_submodule(child)
        extra = CHILD_ELEMENTWISE.get(name, {}).get(child, 0)
        assert [get_module_flops(module), get_module_macs(module), module.__params__] == [flops - extra, macs, params]
    ref_totals = REF[name]["totals"]
    assert [prof.get_total_macs(), prof.get_total_params()] == [ref_totals[1], ref_totals[2]]
    assert [prof.get_total_macs(as_string=True), prof.get_total_params(as_string=True)] == ref_totals[4:]
    assert prof.get_total_flops() == ref_totals[0] - ELEMENTWISE[name]
    prof.end_profile()
    assert not any(hasattr(m, "__flops__") or hasattr(m, "__macs__") for m in model.modules())  # removed


def test_only_forwards_between_start_and_stop_count():
    model = MAKER.build("linear_chain")
    x = torch.randn(4, 16)
    model(x)  # before start: not counted
    prof = FlopsProfiler(model)
    prof.start_profile()
    model(x).sum().backward()  # the backward's products are not counted (DeepSpeed's are forward flops)
    torch.mm(torch.ones(8, 8), torch.ones(8, 8))  # outside any module's forward: not counted
    prof.stop_profile()
    model(x)  # after stop: not counted
    assert prof.get_total_flops() == REF["linear_chain"]["flops"]
    prof.end_profile()


def test_an_ignored_module_counts_as_its_parents_work():
    model = MAKER.build("block")
    prof = FlopsProfiler(model)
    prof.start_profile(ignore_list=[torch.nn.Linear])
    model(torch.randn(MAKER.MODELS["block"]))
    assert model.qkv.__flops__ == 0 and model.mlp[0].__flops__ == 0
    assert model.mlp.__flops__ == 2 * REF["block"]["children"]["mlp"][1]  # its Linear layers' products, as its own
    assert prof.get_total_macs() == REF["block"]["macs"]
    prof.end_profile()


def test_print_model_profile_writes_the_profile_and_leaves_eval_mode(tmp_path, capsys):
    model = MAKER.build("mlp_relu").train()
    out = tmp_path / "sub" / "profile.txt"
    get_model_profile(model, input_shape=(4, 16), output_file=str(out), module_depth=-1, top_modules=2)
    text = out.read_text()
    assert "3.07 KMACs" in text and "808" in text and "Linear(" in text and "depth 1:" in text
    assert capsys.readouterr().out.count("KMACs") == 0  # all of it went to the file
    assert not model.training  # get_model_profile leaves the model in eval mode, as DeepSpeed's
    get_model_profile(MAKER.build("linear_chain"), input_shape=(4, 16), detailed=False)
    assert "fwd flops per rank" in capsys.readouterr().out


def test_number_formats_and_refusals():
    assert [number_to_string(n) for n in (0, 0.5, 5e-5, 999, 1234, 2.5e6, 3e9, 4e12)] == REF["number_to_string"]
    assert [params_to_string(n) for n in (808, 1.5e9)] == REF["params_to_string"]
    with pytest.raises(ValueError, match="input_shape"):
        get_model_profile(MAKER.build("linear_chain"), input_shape=[4, 16])
    with pytest.raises(ValueError, match="mode"):
        get_model_profile(MAKER.build("linear_chain"), input_shape=(4, 16), mode="backward", warm_up=0)
