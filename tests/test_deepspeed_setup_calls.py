"""The calls a DeepSpeed script makes to set itself up, on `zero_core.deepspeed`: its command-line arguments under
either name, the process group (a GPU script's hard-coded nccl on CPUs), and the engine's config queries."""

from __future__ import annotations

import pytest
from parity_workers import ds_config, make_batches, make_model

import zero_core.deepspeed as deepspeed


@pytest.mark.parametrize("stage, offload", [(1, None), (2, "cpu"), (3, None)])
def test_config_queries_answer_from_the_config(stage, offload):
    extra = {"offload_optimizer": {"device": offload}} if offload else {}
    cfg = ds_config(stage, "bf16", 2, **extra)
    cfg.update(gradient_predivide_factor=2.0, prescale_gradients=True, checkpoint={"tag_validation": "Fail"})
    cfg["zero_optimization"].update(overlap_comm=True, reduce_scatter=False)
    model = make_model()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    assert engine.zero_cpu_offload() == (offload == "cpu")
    assert engine.zero_optimization_partition_gradients() == (stage >= 2)
    assert engine.zero_optimization_partition_weights() == (stage == 3)
    assert engine.zero_overlap_comm() and not engine.zero_reduce_scatter()
    assert engine.gradient_predivide_factor() == 2.0 and not engine.postscale_gradients()
    assert engine.checkpoint_tag_validation_enabled() and engine.checkpoint_tag_validation_fail()
    assert not (engine.amp_enabled() or engine.sparse_gradients_enabled() or engine.elasticity_enabled())
    assert (engine.mp_world_size, engine.seq_dp_world_size, engine.data_parallel_group) == (1, 1, None)
    # DeepSpeed's stage 3 gives a model built outside zero.Init its ds_numel / ds_shape: scripts count with them
    sizes = [(getattr(p, "ds_numel", None), getattr(p, "ds_shape", None)) for p in model.parameters()]
    assert sizes == ([(p.numel(), p.shape) for p in model.parameters()] if stage == 3 else [(None, None)] * len(sizes))
    engine.close()


@pytest.mark.slow  # a fresh interpreter (the process group is global): outside the fast tier
def test_a_hard_coded_nccl_backend_runs_on_gloo_without_a_gpu():
    import os
    import subprocess
    import sys

    from helpers import repo_pythonpath

    code = ("import torch.distributed as dist, zero_core.deepspeed as deepspeed\n"
            "deepspeed.init_distributed(dist_backend='nccl')\nprint('backend', dist.get_backend())")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**env, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": repo_pythonpath()})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["zero_core: init_distributed(dist_backend='nccl') without a CUDA device uses "
                                        "gloo", "backend gloo"]


def test_the_config_comes_from_deepspeeds_arguments_under_either_name(tmp_path):
    import argparse
    import json

    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(ds_config(1, "fp32", 2)))
    parser = deepspeed.add_config_arguments(argparse.ArgumentParser())
    for flags in (["--deepspeed", "--deepspeed_config", str(path)], ["--deepscale", "--deepscale_config", str(path)]):
        model = make_model()
        engine, *_ = deepspeed.initialize(args=parser.parse_args(flags), model=model,
                                          model_parameters=model.parameters())
        assert engine.train_micro_batch_size_per_gpu() == 2 and engine.zero_optimization_stage() == 1
        engine.close()
    both = parser.parse_args(["--deepspeed_config", str(path), "--deepscale_config", str(path)])
    with pytest.raises(ValueError, match="pass one"):
        deepspeed.initialize(args=both, model=make_model(), model_parameters=None)


def test_was_step_applied_is_true_only_after_an_update():
    """As DeepSpeed's: False before any step and after a step() inside an accumulation window."""
    cfg = {**ds_config(2, "fp32", 2), "gradient_accumulation_steps": 2}
    model = make_model()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    applied = [engine.was_step_applied()]
    for x, y in make_batches(4, 2):
        engine.backward(engine(x.to(engine.device), y.to(engine.device)).loss)
        engine.step()
        applied.append(engine.was_step_applied())
    assert applied == [False, False, True, False, True]
    engine.close()


def test_without_any_optimizer_the_model_runs_forward_but_backward_is_one_line():
    """DeepSpeed builds no optimizer without a config section or optimizer= and asserts at backward; zero_core
    does not invent one."""
    import torch

    from zero_core import ConfigError

    cfg = {k: v for k, v in ds_config(2, "fp32", 2).items() if k != "optimizer"}
    model = make_model()
    engine, optimizer, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    x, y = make_batches(1, 2)[0]
    loss = engine(x.to(engine.device), y.to(engine.device)).loss
    assert torch.isfinite(loss)
    with pytest.raises(ConfigError) as e:
        engine.backward(loss)
    assert "no optimizer" in str(e.value) and "'optimizer' section" in str(e.value) and "\n" not in str(e.value)
    engine.close()


@pytest.mark.parametrize("as_file", [False, True])
def test_without_an_optimizer_the_configs_scheduler_is_not_read(tmp_path, as_file):
    """transformers' evaluation-only setup (Trainer.evaluate/predict before any training) drops the config's
    optimizer but keeps its scheduler, whose "auto" total_num_steps it filled with 0: DeepSpeed builds a scheduler
    only with an optimizer, so the engine runs; so does zero_core's, with no scheduler, as DeepSpeed returns."""
    import json

    import torch

    cfg = {k: v for k, v in ds_config(3, "fp32", 2).items() if k != "optimizer"}
    cfg["scheduler"] = {"type": "WarmupDecayLR", "params": {"total_num_steps": 0, "warmup_num_steps": 0,
                                                            "warmup_min_lr": 0, "warmup_max_lr": 5e-5}}
    if as_file:
        (tmp_path / "ds.json").write_text(json.dumps(cfg))
    model = make_model()
    engine, _, _, scheduler = deepspeed.initialize(model=model, config=str(tmp_path / "ds.json") if as_file else cfg)
    x, y = make_batches(1, 2)[0]
    assert scheduler is None and torch.isfinite(engine(x.to(engine.device), y.to(engine.device)).loss)
    engine.close()
