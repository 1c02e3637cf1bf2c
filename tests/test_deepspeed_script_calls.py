"""The engine calls DeepSpeed's example scripts make around the training loop, on `zero_core.deepspeed`: the
engine's rank, precision and batch queries, manual accumulation boundaries, the arguments and return values
loops rely on, and `deepspeed.ops.adam`'s optimizers, which train as the torch AdamW/Adam they stand for (the
module-level calls, `deepspeed.comm` and `get_accelerator()`: test_deepspeed_module_calls.py)."""

from __future__ import annotations

import pytest
import torch
from parity_workers import ds_config, make_batches, make_model

import zero_core.deepspeed as deepspeed
from zero_core.deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam


def _engine(dtype: str = "bf16", optimizer=None, **zero):
    cfg = ds_config(2, dtype, 2, gas=2, clip=0.5, **zero)
    model = make_model()
    if callable(optimizer):
        optimizer = optimizer(model.parameters())
        cfg.pop("optimizer")
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg,
                                      optimizer=optimizer)
    return engine


def _forward(engine, x, y):
    """The batch on the engine's device, as a DeepSpeed loop moves it (the rank's GPU under ZB_TEST_DEVICE=cuda)."""
    return engine(x.to(engine.device), y.to(engine.device))


def test_engine_queries_answer_as_deepspeed_does(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")
    engine = _engine()
    assert (engine.local_rank, engine.global_rank, engine.dp_world_size) == (0, 0, 1)
    assert engine.bfloat16_enabled() and not engine.fp16_enabled()
    assert engine.gradient_clipping() == 0.5
    assert engine.get_batch_info() == (4, 2, 2)
    assert engine.communication_data_type == torch.bfloat16
    assert engine.steps_per_print() is None and engine.wall_clock_breakdown() is False
    from packaging.version import Version

    from zero_core.deepspeed.runtime.engine import DeepSpeedEngine

    assert isinstance(engine, DeepSpeedEngine) and isinstance(engine, deepspeed.DeepSpeedEngine)
    assert Version(deepspeed.__version__) >= Version("0.19.8")  # as scripts that gate on a release compare it
    closed = []
    close = engine.close
    monkeypatch.setattr(engine, "close", lambda: closed.append(close()))
    engine.destroy()  # DeepSpeed's name for releasing it
    assert closed == [None]


@pytest.mark.parametrize("make, torch_kind, offload", [
    (lambda p: FusedAdam(p, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1), torch.optim.AdamW, None),
    (lambda p: FusedAdam(p, lr=1e-3, adam_w_mode=False, weight_decay=0.1), torch.optim.Adam, None),
    (lambda p: DeepSpeedCPUAdam(p, lr=1e-3, weight_decay=0.1), torch.optim.AdamW, {"device": "cpu"}),
])
def test_deepspeed_adam_classes_train_as_the_torch_optimizer_they_stand_for(make, torch_kind, offload):
    zero = {"offload_optimizer": offload} if offload else {}
    made = make(make_model().parameters())
    assert type(made) is torch_kind
    kw = {k: made.defaults[k] for k in ("lr", "betas", "eps", "weight_decay")}
    states = []
    for build in (make, lambda p: torch_kind(p, **kw)):
        engine = _engine("fp32", build, **zero)
        for x, y in make_batches(4, 2):
            engine.backward(_forward(engine, x, y).loss)
            engine.step()
        states.append(engine.full_state_dict())
        engine.close()
    assert all(torch.equal(states[0][k], v) for k, v in states[1].items())
    untrained = make_model().state_dict()
    assert any(not torch.equal(untrained[k], v) for k, v in states[0].items())


@pytest.mark.parametrize("kw, word", [({"amsgrad": True}, "amsgrad"), ({"bias_correction": False}, "bias_correction")])
def test_what_the_kernels_do_not_compute_is_refused_in_one_line(kw, word):
    with pytest.raises(ValueError) as e:
        FusedAdam(make_model().parameters(), **kw)
    assert word in str(e.value) and "\n" not in str(e.value)


def _accumulated(stage: int, manual: bool, offload: bool) -> dict:
    """3 windows of 3 micro-batches: step() after each micro-batch (the config counts), or DeepSpeed's manual
    form, the boundary set before each backward and step() once per window (Accelerate's DeepSpeed wrapper)."""
    zero = {"offload_optimizer": {"device": "cpu"}} if offload else {}
    cfg = ds_config(stage, "fp32", 1, gas=3, clip=1.0, **zero)
    cfg["zero_core"] = {"overlap_host_update": 1.0} if offload else {}
    model = make_model()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    for i, (x, y) in enumerate(make_batches(9, 1)):
        last = i % 3 == 2
        if manual:
            engine.set_gradient_accumulation_boundary(last)
        assert engine.is_gradient_accumulation_boundary() == last
        engine.backward(_forward(engine, x, y).loss)
        if last or not manual:
            engine.step()
    state = engine.full_state_dict()
    engine.close()
    return state


@pytest.mark.parametrize("stage, offload", [(1, False), (2, False), (3, False), (2, True)])
def test_manual_accumulation_boundaries_equal_the_counted_ones(stage, offload):
    counted, manual = _accumulated(stage, False, offload), _accumulated(stage, True, offload)
    assert all(torch.equal(manual[k], v) for k, v in counted.items())
    assert any(not torch.equal(counted[k], v) for k, v in make_model().state_dict().items())


def test_retain_graph_lets_a_second_backward_reuse_the_graph():
    """engine.backward(loss, retain_graph=True), DeepSpeed's second argument: the same loss twice in a window
    of 2 equals computing it twice."""
    states = []
    for reuse in (True, False):
        cfg = ds_config(2, "fp32", 2, gas=2)
        model = make_model()
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
        x, y = make_batches(1, 2)[0]
        loss = _forward(engine, x, y).loss
        engine.backward(loss, retain_graph=True)
        engine.step()
        engine.backward(loss if reuse else _forward(engine, x, y).loss)
        engine.step()
        states.append(engine.full_state_dict())
        engine.close()
    assert all(torch.equal(states[0][k], v) for k, v in states[1].items())


def test_deepspeeds_other_arguments_are_taken_or_refused_in_one_line(tmp_path):
    engine = _engine("fp32")
    x, y = (t.to(engine.device) for t in make_batches(1, 2)[0])
    engine.backward(engine(x, y).loss)
    engine.step(lr_kwargs=None)
    engine.save_checkpoint(tmp_path, exclude_frozen_parameters=False)
    refused = [
        lambda: engine.step(lr_kwargs={"increment": 1}),
        lambda: engine.load_checkpoint(tmp_path, custom_load_fn=lambda **kw: None),
    ]
    for call in refused:
        with pytest.raises(NotImplementedError) as e:
            call()
        assert "is not supported by zero_core" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "other").exists()  # refused before anything was written
    engine.close()


def test_a_moment_the_client_optimizer_does_not_keep_is_one_line():
    from zero_core.deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    engine = _engine("fp32", lambda p: torch.optim.SGD(p, lr=0.1))
    param = next(p for p in engine.module.parameters() if p.requires_grad)
    assert safe_get_full_fp32_param(param).shape == param.shape
    with pytest.raises(ValueError) as e:
        safe_get_full_optimizer_state(param, "exp_avg")
    assert "keeps no 'exp_avg' state" in str(e.value) and "\n" not in str(e.value)
    engine.close()


def test_offload_loss_scale_and_loader_queries_answer_as_deepspeed_does():
    engine = _engine("fp16", offload_optimizer={"device": "cpu"})
    assert engine.dynamic_loss_scale()  # fp16 without a fixed loss_scale
    engine.scaler.scale.fill_(1024.0)  # as if the scale had moved: the optimizers read the engine's
    assert engine.optimizer.loss_scale == engine.optimizer.cur_scale == engine.loss_scale == 1024.0
    assert engine.client_optimizer.loss_scale == engine.client_optimizer.cur_scale == 1024.0  # initialize's
    assert engine.zero_offload_optimizer().device == "cpu" and engine.zero_offload_param() is None
    assert engine.get_mom() == [(0.9, 0.95)] * len(engine.client_optimizer.param_groups)
    assert engine.training_dataloader is None
    engine.empty_partition_cache()  # nothing cached between passes: a no-op that scripts may call
    with pytest.raises(NotImplementedError, match="set_train_micro_batch_size"):
        engine.set_train_micro_batch_size(4)
    engine.close()
    assert not _engine("bf16").dynamic_loss_scale()
    data = torch.utils.data.TensorDataset(torch.randn(8, 4))
    engine, _, loader, _ = deepspeed.initialize(model=make_model(), config=ds_config(2, "fp32", 2), training_data=data)
    assert engine.training_dataloader is loader and len(loader) == 4
    engine.close()
    odd = torch.utils.data.TensorDataset(torch.randn(9, 4))  # 4 batches of 2 and one of 1
    for drop, batches in ((False, 5), (True, 4)):
        engine, _, loader, _ = deepspeed.initialize(model=make_model(), training_data=odd,
                                                    config={**ds_config(2, "fp32", 2), "dataloader_drop_last": drop})
        assert len(loader) == batches and [len(b[0]) for b in loader][-1] == (2 if drop else 1)
        engine.close()


def test_get_mom_follows_a_schedule_that_cycles_momentum():
    """beta1 of the next update under OneCycle, as DeepSpeed 0.19.8 recorded it; SGD reports its momentum."""
    import json
    from pathlib import Path

    data = json.loads((Path(__file__).parent / "fixtures" / "deepspeed_lr" / "schedules.json").read_text())
    case = next(c for c in data["cases"] if c["type"] == "OneCycle")
    cfg = ds_config(2, "fp32", 2)
    cfg["scheduler"] = {"type": "OneCycle", "params": case["params"]}
    model = make_model()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    for n, (x, y) in enumerate(make_batches(4, 2)):
        assert [m[0] for m in engine.get_mom()] == [case["updates"][n]["beta1"][0]], n
        engine.backward(_forward(engine, x, y).loss)
        engine.step()
    engine.close()
    sgd = _engine("fp32", optimizer=lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.7))
    assert sgd.get_mom() == [0.7]
    sgd.close()
    adagrad = _engine("fp32", optimizer=lambda params: torch.optim.Adagrad(params, lr=0.1))
    assert adagrad.get_mom() == [0.0]  # no momentum: DeepSpeed reports 0.0
    adagrad.close()


def test_a_loop_written_for_deepspeed_gets_its_return_values(tmp_path):
    """`loss = engine.backward(loss)`, `get_global_grad_norm()` (None before the first step), numeric tags
    (`save_checkpoint(dir, tag=epoch)`), `load_checkpoint` of a first run's empty folder: (None, None), and of a
    checkpoint: the path it loaded as a str."""
    engine = _engine(dtype="fp32")
    assert engine.load_checkpoint(tmp_path / "ckpt") == (None, None)
    assert engine.get_global_grad_norm() is None
    for x, y in make_batches(2, 2):
        loss = engine(x.to(engine.device), y.to(engine.device)).loss
        assert engine.backward(loss).item() == loss.item() / 2  # DeepSpeed's: the loss over the 2 micro-steps
        engine.step()
    norm = engine.get_global_grad_norm()
    assert isinstance(norm, torch.Tensor) and norm.dim() == 0 and norm.item() > 0  # DeepSpeed's is a tensor
    assert engine.save_checkpoint(tmp_path / "ckpt", tag=1) is True  # DeepSpeed's return value
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == "1"
    fresh = _engine(dtype="fp32")
    folder, client_state = fresh.load_checkpoint(tmp_path / "ckpt", tag=1)
    assert folder == str(tmp_path / "ckpt" / "1" / "rank_00000.safetensors")  # the file it loaded, a str as DeepSpeed's
    # nothing saved by the loop: DeepSpeed's own entries alone (tests/test_deepspeed_client_state.py checks them)
    assert {"buffer_names", "param_shapes", "ds_config", "ds_version"} <= set(client_state)
    assert "global_steps" not in client_state and fresh.global_steps == engine.global_steps
    assert fresh.get_global_grad_norm() is None  # loaded, not stepped
