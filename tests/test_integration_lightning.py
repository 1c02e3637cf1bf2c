"""Lightning's ZeroStrategy (zero_core.integrations.lightning) against Lightning's DDPStrategy on 2 gloo ranks,
fp32: the same LightningModule (tiny GPT-2, AdamW, a step-interval LambdaLR, clipping, accumulation) gives the
same losses within 1e-5; a checkpoint saved through Lightning's API resumes at another stage, on 2 ranks and on
1, and continues the curve; `zbench convert` reads it; the registered names build the strategy; a checkpoint of
Lightning's own DeepSpeedStrategy resumes through ZeroStrategy as Lightning resumes it."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("lightning")
pytest.importorskip("transformers")

import lightning_workers as lw  # noqa: E402
from dist_harness import run_ranks  # noqa: E402
from helpers import cli  # noqa: E402

pytestmark = pytest.mark.slow  # spawned ranks or whole runs: outside the fast tier (-m 'not slow')

TOL = 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_zero_strategy_equals_ddp_and_resumes(tmp_path, stage):
    got = run_ranks(lw.run, 2, stage, str(tmp_path))
    ddp, first, resumed = got["ddp"], got["first"], got["resumed"]
    assert len(ddp["losses"]) == 32 and first["step"] == 8 and resumed["step"] == 16
    assert first["losses"] == pytest.approx(ddp["losses"][:16], abs=TOL)
    assert resumed["losses"] == pytest.approx(ddp["losses"][16:], abs=TOL)  # epochs 3-4 after the reload
    assert (
        max(float((resumed["weights"][k] - ddp["weights"][k]).abs().max()) for k in ddp["weights"]) < 1e-3
    )  # 16 Adam steps at lr 1e-2
    alone = run_ranks(lw.resume_alone, 1, 1 if stage == 3 else 3, str(tmp_path))  # 1 rank, another stage
    assert alone["step"] == 16 and alone["losses"] == pytest.approx(ddp["losses"][16:], abs=TOL)
    assert max(float((alone["weights"][k] - ddp["weights"][k]).abs().max()) for k in ddp["weights"]) < 1e-3
    out = tmp_path / "fp32"
    result = cli("convert", tmp_path / "zero.ckpt", "--to", "fp32", "--out", out)
    assert result.exit_code == 0, result.output
    from safetensors.torch import load_file

    tensors = {}
    for f in sorted(out.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    assert tensors and torch.equal(
        tensors["model.transformer.wpe.weight"], first["weights"]["model.transformer.wpe.weight"]
    )


def test_no_gradient_clip_val_means_no_clipping_as_in_lightnings_strategies():
    """Lightning's DDP and DeepSpeed strategies do not clip unless Trainer(gradient_clip_val=...) says so."""
    assert run_ranks(lw.clipping, 1) == [0.0, 0.5, 0.0]


def test_registered_names_build_the_strategy():
    from lightning.pytorch.strategies import StrategyRegistry

    from zero_core.integrations.lightning import ZeroStrategy

    for name, stage in (("zero_stage_1", 1), ("zero_stage_2_offload", 2), ("zero_stage_3_offload", 3)):
        strategy = StrategyRegistry.get(name)
        assert isinstance(strategy, ZeroStrategy) and strategy.zero_config["zero_optimization"]["stage"] == stage
    offload = StrategyRegistry.get("zero_stage_3_offload").zero_config["zero_optimization"]
    assert offload["offload_optimizer"] == {"device": "cpu"} and offload["offload_param"] == {"device": "cpu"}
    assert "deepspeed_stage_3" in StrategyRegistry  # Lightning's own names untouched


@pytest.mark.slow
@pytest.mark.parametrize("saved, stage", [(2, 3), (3, 1)])
def test_zero_strategy_resumes_a_lightning_deepspeed_checkpoint_as_lightning_does(saved, stage):
    """A checkpoint of Lightning's own DeepSpeedStrategy (ZeRO-2/3, 2 CPU ranks, tests/fixtures/lightning_deepspeed):
    ZeroStrategy at another stage resumes it with ckpt_path= and ends on the weights Lightning's resume reached."""
    from safetensors.torch import load_file

    from helpers import FIXTURES

    folder = FIXTURES / "lightning_deepspeed" / str(saved)
    got = run_ranks(lw.resume_deepspeed, 2, str(folder), stage)
    want = load_file(str(folder / "continued.safetensors"))
    assert got["step"] == 4 and got["weights"].keys() == want.keys()
    for name, w in want.items():
        assert torch.allclose(got["weights"][name], w, rtol=0, atol=1e-6), name


@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 3])
def test_zero_strategy_resumes_a_lightning_model_parallel_checkpoint_as_lightning_does(stage):
    """Lightning's ModelParallelStrategy (FSDP2) checkpoint, a DCP folder with `optimizer_0.state.*` and meta.pt:
    ZeroStrategy resumes it with ckpt_path= (moments, step and Lightning's loops) and ends on the weights
    Lightning's own resume reached."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    from helpers import FIXTURES

    continued = FIXTURES / "lightning" / "model_parallel" / "continued.safetensors"
    got = run_ranks(lw.resume_model_parallel, 2, stage)
    want = load_file(str(continued))
    with safe_open(str(continued), "pt") as f:
        assert got["step"] == int(f.metadata()["global_step"]) == 4
    assert got["weights"].keys() == want.keys()
    for name, w in want.items():
        assert torch.allclose(got["weights"][name], w, rtol=0, atol=1e-6), name


@pytest.mark.slow
def test_converted_checkpoint_opens_with_load_from_checkpoint(tmp_path):
    """Lightning's documented path: convert_zero_checkpoint_to_fp32_state_dict(folder, file), then
    load_from_checkpoint(file): the engine's weights and the module's hyper-parameters."""
    got = run_ranks(lw.convert_and_load, 1, str(tmp_path))
    assert got["width"] == 32 and got["global_step"] == 16  # 32 samples in batches of 2, on 1 rank
    assert {"state_dict", "hyper_parameters", "epoch", "loops", "pytorch-lightning_version"} <= set(got["keys"])
    assert got["loaded"].keys() == got["weights"].keys()
    assert all(torch.equal(got["loaded"][k], got["weights"][k]) for k in got["weights"])
    assert set(torch.load(tmp_path / "model.pt", weights_only=True)) == set(got["keys"])  # plain data only


def test_convert_reads_a_lightning_deepspeed_checkpoint(tmp_path):
    """A folder of Lightning's own DeepSpeedStrategy converts to DeepSpeed's consolidation under the module's names
    (the tied head included, as DeepSpeed's converter gives it), with Lightning's entries beside it."""
    from safetensors.torch import load_file

    from helpers import FIXTURES
    from zero_core.integrations.lightning import convert_zero_checkpoint_to_fp32_state_dict

    folder = FIXTURES / "lightning_deepspeed" / "2"
    written = convert_zero_checkpoint_to_fp32_state_dict(folder / "epoch=0-step=2.ckpt", tmp_path / "model.pt")
    want = load_file(str(folder / "expected_full.safetensors"))  # stored without the tied model.head.weight
    assert set(written["state_dict"]) == set(want) | {"model.head.weight"} and written["global_step"] == 2
    assert all(torch.equal(written["state_dict"][k], w) for k, w in want.items())
    assert written["state_dict"]["model.head.weight"] is written["state_dict"]["model.emb.weight"]
