"""`zbench train --config`: the flags typed beside a config fill its "auto" values, are printed, and never disagree
silently.

The ranks are not started here (`launch` is replaced); tests/test_seed_configs.py runs real ones."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import zbench.cli
import zbench.train_demo
from zbench.cli import main

SUMMARY = {
    "stage": 2,
    "world_size": 2,
    "steps": 1,
    "warmup": 0,
    "first_loss": 1.0,
    "final_loss": 0.5,
    "tokens_per_s": 1.0,
    "step_ms": 1.0,
    "peak_gib": float("nan"),
    "trainable_params": 1,
    "breakdown": {},
}


@pytest.fixture
def train(tmp_path, monkeypatch):
    """Run `zbench train --config <config> <flags>`; returns (result, the config the ranks would get or None)."""
    jobs = []
    monkeypatch.setattr(zbench.train_demo, "launch", lambda job, nproc: jobs.append(job) or SUMMARY)  # imported at use

    def run(config: dict, *flags: str):
        path = tmp_path / "ds.json"
        path.write_text(json.dumps(config))
        jobs.clear()
        result = CliRunner().invoke(main, ["train", "--config", str(path), *flags])
        assert "Traceback" not in result.output
        return result, (jobs[0].ds_config if jobs else None)

    return run


def _error(result) -> str:
    assert result.exit_code != 0 and len(result.output.strip().splitlines()) == 1, result.output
    assert result.output.startswith("Error: ")
    return result.output.strip().removeprefix("Error: ")


ZERO2 = {
    "train_micro_batch_size_per_gpu": "auto",
    "train_batch_size": "auto",
    "gradient_clipping": "auto",
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
    "scheduler": {
        "type": "WarmupDecayLR",
        "params": {
            "warmup_min_lr": "auto",
            "warmup_max_lr": "auto",
            "warmup_num_steps": "auto",
            "total_num_steps": "auto",
        },
    },
    "bf16": {"enabled": "auto"},
    "zero_optimization": {"stage": 2},
}


def test_flags_fill_the_autos_and_each_is_printed_once(train):
    result, ds = train(
        ZERO2, "--lr", "0.003", "--micro-batch", "3", "--precision", "bf16", "--steps", "5", "--warmup", "2"
    )
    assert result.exit_code == 0, result.output
    [from_flags, defaults] = [line for line in result.output.splitlines() if line.startswith("filled ")]
    assert from_flags == (
        "filled from flags: train_micro_batch_size_per_gpu = 3 (--micro-batch), train_batch_size = 6 "
        "(--gpus, --micro-batch), optimizer.params.lr = 0.003 (--lr), scheduler.params.warmup_max_lr = "
        "0.003 (--lr), scheduler.params.total_num_steps = 7 (--steps + --warmup), "
        "scheduler.params.warmup_num_steps = 2 (--warmup), bf16.enabled = true (--precision bf16)"
    )
    assert defaults == (
        "filled with defaults: gradient_clipping = 1.0, optimizer.params.weight_decay = 0.0, "
        "scheduler.params.warmup_min_lr = 0.0"
    )
    assert ds["optimizer"]["params"] == {"lr": 0.003, "weight_decay": 0.0} and ds["bf16"] == {"enabled": True}
    assert "auto" not in json.dumps(ds)


def test_unfilled_autos_name_the_flags_that_fill_them(train):
    result, ds = train(ZERO2)
    assert ds is None
    assert _error(result) == (
        "config has 4 problems: (1) optimizer.params.lr cannot be 'auto' without --lr; "
        "pass it, or set a number such as 1e-4 | "
        "(2) scheduler.params.warmup_max_lr cannot be 'auto' without --lr; pass it, or set a number, or a numeric "
        "optimizer.params.lr | (3) bf16.enabled cannot be 'auto' without --precision; pass it, or set true or false "
        "| (4) train_micro_batch_size_per_gpu cannot be 'auto' without --micro-batch; pass it, or set a number"
    )


def test_bf16_auto_is_resolved_by_precision(train):
    config = {"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": "auto"}}
    assert (
        _error(train(config)[0]) == "bf16.enabled cannot be 'auto' without --precision; pass it, or set true or false"
    )
    assert train(config, "--precision", "bf16")[1]["bf16"] == {"enabled": True}
    assert train(config, "--precision", "fp32")[1]["bf16"] == {"enabled": False}


@pytest.mark.parametrize(
    "config, flags, message",
    [
        (
            {**ZERO2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-6}}},
            ["--lr", "0.003", "--micro-batch", "2", "--precision", "bf16"],
            "optimizer.params.lr is 1e-06 in the config but --lr gives 0.003; "
            'make them agree or set optimizer.params.lr to "auto"',
        ),
        (
            {"train_micro_batch_size_per_gpu": 2, "fp16": {"enabled": True}},
            ["--precision", "bf16"],
            "fp16.enabled is true in the config but --precision bf16 gives false; "
            'make them agree or set fp16.enabled to "auto"',
        ),
        (
            {"train_micro_batch_size_per_gpu": 16},
            ["--micro-batch", "2"],
            "train_micro_batch_size_per_gpu is 16 in the config but --micro-batch gives 2; make them agree or set "
            'train_micro_batch_size_per_gpu to "auto"',
        ),
        (
            {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3}},
            ["--stage", "1"],
            "--stage 1 contradicts zero_optimization.stage = 3 in the config; drop --stage or change the config",
        ),
        (
            {
                "train_micro_batch_size_per_gpu": 2,
                "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 100}},
            },
            ["--warmup", "3"],
            "scheduler.params.warmup_num_steps is 100 in the config but --warmup gives 3; make them agree "
            'or set scheduler.params.warmup_num_steps to "auto"',
        ),
        (
            {
                "train_micro_batch_size_per_gpu": 2,
                "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.1, "cycle_max_lr": 1}},
            },
            ["--lr", "0.5"],
            "--lr does not apply: the config's OneCycle scheduler sets the lr from scheduler.params.cycle_min_lr "
            "and cycle_max_lr; drop --lr or change those",
        ),
    ],
)
def test_a_typed_flag_that_contradicts_the_config_is_one_error_naming_both(train, config, flags, message):
    result, ds = train(config, *flags)
    assert _error(result) == message and ds is None


def test_flags_left_at_their_defaults_never_contradict(train):
    config = {
        "train_micro_batch_size_per_gpu": 16,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-6}},
        "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 100, "total_num_steps": 1000}},
        "fp16": {"enabled": True},
        "zero_optimization": {"stage": 1},
    }
    result, ds = train(config)
    assert result.exit_code == 0, result.output
    assert ds == config and "filled" not in result.output


def test_a_typed_flag_for_a_key_the_config_lacks_applies(train):
    result, ds = train(
        {"zero_optimization": {"stage": 1}},
        "--micro-batch",
        "3",
        "--lr",
        "0.01",
        "--precision",
        "fp16",
        "--grad-accum",
        "2",
    )
    assert result.exit_code == 0, result.output
    assert ds == {
        "zero_optimization": {"stage": 1},
        "train_micro_batch_size_per_gpu": 3,
        "gradient_accumulation_steps": 2,
        "fp16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
    }
    assert (
        "filled from flags: train_micro_batch_size_per_gpu = 3 (--micro-batch), gradient_accumulation_steps = 2 "
        "(--grad-accum), fp16.enabled = true (--precision fp16), optimizer.params.lr = 0.01 (--lr)"
    ) in result.output
    result, ds = train(
        {"train_micro_batch_size_per_gpu": 2, "scheduler": {"type": "WarmupLR"}}, "--lr", "0.02", "--stage", "3"
    )
    assert ds["optimizer"]["params"]["lr"] == ds["scheduler"]["params"]["warmup_max_lr"] == 0.02
    assert ds["zero_optimization"] == {"stage": 3} and "zero_optimization.stage = 3 (--stage)" in result.output


def test_the_run_length_fills_autos_even_when_not_typed(train):
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": "auto", "total_num_steps": "auto"}},
        "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"},
    }
    result, ds = train(config)
    assert ds["scheduler"]["params"] == {"warmup_num_steps": 1, "total_num_steps": 30}  # --steps 30, --warmup 0
    assert ds["zero_optimization"]["reduce_bucket_size"] == 64 * 64  # --model tiny: hidden size 64
    assert "zero_optimization.reduce_bucket_size = 4096 (--model tiny)" in result.output
