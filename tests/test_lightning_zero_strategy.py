"""ZeroStrategy as a drop-in for Lightning's DeepSpeedStrategy: the Trainer's precision decides the engine's
fp16/bf16 section and the batch dtype, DeepSpeedStrategy's keyword arguments become the config keys Lightning
writes them to, and a fresh Trainer evaluates a ZeroStrategy checkpoint folder."""

from __future__ import annotations

import pytest

pytest.importorskip("lightning")

import lightning_zero_workers as lzw  # noqa: E402
from dist_harness import run_ranks  # noqa: E402

# Lightning 2.6.6's DeepSpeedStrategy with DeepSpeed 0.19.8 on CPU (ZeRO-2, torch Adam), lightning_zero_workers'
# module: Trainer(precision="bf16-mixed") with no bf16 section in the config, and the same with
# {"bf16": {"enabled": true}} in it, both give these losses; fp32 gives 8.877106, 4.994639, ...
DEEPSPEED_BF16 = [8.882712, 5.017126, 1.298709, 1.873122, 2.630593, 2.62708, 2.728344, 1.227968]
FP32_FIRST = [8.877106, 4.994639]


@pytest.mark.parametrize("config", [None, {"bf16": {"enabled": True}}])
def test_bf16_mixed_trains_in_bf16_as_deepspeed_strategy(config):
    losses = run_ranks(lzw.fit_losses, 1, "bf16-mixed", config)
    assert isinstance(losses, list), losses  # with a bf16 section the batch is cast to the weights' dtype
    assert losses[0] == pytest.approx(DEEPSPEED_BF16[0], abs=1e-6)  # the bf16 forward, not fp32's 8.877106
    assert losses[1] != pytest.approx(FP32_FIRST[1], abs=1e-4)
    assert losses == pytest.approx(DEEPSPEED_BF16, abs=2e-2)  # bf16 rounding of two implementations


def test_a_config_precision_against_the_trainers_is_refused():
    """Lightning's DeepSpeedStrategy fails inside DeepSpeed here (a dtype mismatch, or fp16 and bf16 both on)."""
    message = run_ranks(lzw.fit_losses, 1, "32-true", {"bf16": {"enabled": True}})
    assert message.startswith("Trainer(precision='32-true') trains in fp32 but the config") and "\n" not in message


def test_config_precision_agreeing_or_auto_is_kept():
    from zero_core.integrations.lightning_precision import format_precision

    for flag, config in (("16-mixed", {"fp16": {"enabled": "auto"}}), ("32-true", {"bf16": {"enabled": False}})):
        format_precision(config, flag, {})
    with pytest.raises(ValueError, match="train in fp16; make them agree"):
        format_precision({"fp16": {"enabled": True}}, "bf16-mixed", {})
    fp16 = {}
    format_precision(fp16, "16-mixed", {"loss_scale": 0, "initial_scale_power": 12})
    assert fp16 == {"fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 12}}


def test_deepspeed_strategy_keyword_arguments_become_config_keys(tmp_path):
    from zero_core.integrations.lightning import ZeroStrategy

    strategy = ZeroStrategy(stage=3, offload_optimizer=True, offload_optimizer_device="nvme", nvme_path=str(tmp_path),
                            reduce_bucket_size=5_000_000, overlap_comm=False, partition_activations=True,
                            logging_batch_size_per_gpu=4, pin_memory=True, process_group_backend="gloo")
    config = strategy.zero_config
    assert config["zero_optimization"] == {
        "stage": 3, "reduce_bucket_size": 5_000_000, "overlap_comm": False,
        "offload_optimizer": {"device": "nvme", "nvme_path": str(tmp_path), "pin_memory": True}}
    assert config["activation_checkpointing"] == {"partition_activations": True}
    assert config["train_micro_batch_size_per_gpu"] == 4
    kept = ZeroStrategy(stage=1, reduce_bucket_size=7, config={"zero_optimization": {"stage": 2}})
    assert kept.zero_config["zero_optimization"] == {"stage": 2, "reduce_bucket_size": 7}  # the config wins


def test_unknown_keyword_arguments_are_refused_by_name():
    from zero_core.integrations.lightning import ZeroStrategy

    with pytest.raises(ValueError, match="unknown keyword argument\\(s\\) offload_optimiser, stgae;"):
        ZeroStrategy(stgae=3, offload_optimiser=True)
    with pytest.raises(ValueError, match="remote_device"):
        ZeroStrategy(remote_device="cpu")


@pytest.mark.parametrize("stage", [2, 3])
def test_a_fresh_trainer_validates_a_checkpoint_folder(tmp_path, stage):
    got = run_ranks(lzw.validate_fresh, 1, str(tmp_path / "zero.ckpt"), stage)
    assert got["from_folder"] == pytest.approx(got["after_fit"], abs=1e-6)
    assert abs(got["untrained"] - got["after_fit"]) > 0.1  # the folder's weights, not the new module's


def test_config_optimizer_with_a_module_scheduler_names_the_change():
    message = run_ranks(lzw.refusal_of_config_optimizer_with_module_scheduler, 1)
    assert "return only the optimizer from configure_optimizers" in message and "\n" not in message


def test_cpu_checkpointing_reaches_deepspeed_checkpointing_as_with_deepspeed_strategy():
    assert run_ranks(lzw.cpu_checkpointing_after_fit, 1) is True
