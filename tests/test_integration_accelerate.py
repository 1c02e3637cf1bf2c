"""zero_core's Accelerator (zero_core.integrations.accelerate) against Accelerate's DDP on 2 gloo ranks, fp32: the
same loop (tiny GPT-2, AdamW, a LambdaLR, accumulate(), clip_grad_norm_) gives the same losses within 1e-5;
save_state/load_state round-trip the engine; the refusals name the fix."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("accelerate")
pytest.importorskip("transformers")

import trainer_workers as tw  # noqa: E402
from dist_harness import run_ranks  # noqa: E402

pytestmark = pytest.mark.slow  # spawned ranks or whole runs: outside the fast tier (-m 'not slow')

CONFIG = tw.SEEDS / "000_zero3_offload_config_accelerate.json"


def _loop(rank: int, world: int, zero: bool, folder: str) -> dict:
    import accelerate

    from zero_core.integrations.accelerate import Accelerator

    if zero:  # the seed config less fp16, optimizer, scheduler, accumulation: the loop's
        config = {k: v for k, v in __import__("json").loads(CONFIG.read_text()).items()
                  if k not in ("fp16", "optimizer", "scheduler", "gradient_accumulation_steps")}
        acc = Accelerator(zero_config=config, cpu=True, gradient_accumulation_steps=2)
    else:
        acc = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = tw.tiny_model("gpt2")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    # a torch scheduler steps once per process per update, on Accelerate's DDP and DeepSpeed paths alike
    per_update = lambda s: min(1.0, (s // world + 1) / 3)  # noqa: E731
    sched = torch.optim.lr_scheduler.LambdaLR(opt, per_update)
    loader = torch.utils.data.DataLoader(tw.Samples("gpt2", 32, 1), batch_size=2)
    model, opt, loader, sched = acc.prepare(model, opt, loader, sched)
    losses = []
    for batch in loader:
        with acc.accumulate(model):
            loss = model(**batch).loss
            acc.backward(loss)
            if acc.sync_gradients:
                acc.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad()
        losses.append(float(loss))
    every = [None] * world
    dist.all_gather_object(every, losses)
    out = {"losses": [math.fsum(s) / world for s in zip(*every)], "weights": acc.get_state_dict(model)}
    if zero:
        acc.save_state(f"{folder}/state")
        acc.load_state(f"{folder}/state")
        out["reloaded"] = acc.get_state_dict(model)
    return out


@pytest.mark.slow
def test_zero_accelerator_equals_accelerate_ddp(tmp_path):
    ddp = run_ranks(_loop, 2, False, str(tmp_path))
    zero = run_ranks(_loop, 2, True, str(tmp_path))
    assert len(zero["losses"]) == 8 and zero["losses"] == pytest.approx(ddp["losses"], abs=1e-5)
    assert max(float((zero["weights"][k] - ddp["weights"][k]).abs().max()) for k in ddp["weights"]) < 1e-4
    assert (tmp_path / "state" / "latest").is_file()
    assert all(torch.equal(zero["reloaded"][k], zero["weights"][k]) for k in zero["weights"])


def test_without_a_config_it_names_the_fix(monkeypatch):
    from zero_core.integrations.accelerate import Accelerator

    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED", raising=False)
    with pytest.raises(ValueError, match="zero_config='ds_config.json'"):
        Accelerator(cpu=True)


@pytest.mark.parametrize("explicit_lr", [None, 1e-3])
def test_dummy_optimizer_and_scheduler_fill_the_configs_auto_entries(explicit_lr):
    """Accelerate's DeepSpeed example: DummyOptim's lr and weight decay and DummyScheduler's steps fill the
    config's "auto" entries (an explicit value is kept, as Accelerate's must_match=False keeps it)."""
    from accelerate.utils.deepspeed import DummyOptim, DummyScheduler

    from zero_core.integrations.accelerate import Accelerator

    config = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 1,
              "zero_optimization": {"stage": 2},
              "optimizer": {"type": "AdamW", "params": {"lr": explicit_lr or "auto", "weight_decay": "auto"}},
              "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                                "warmup_num_steps": "auto", "total_num_steps": "auto"}}}
    acc = Accelerator(zero_config=config, cpu=True)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = DummyOptim(model.parameters(), lr=2e-3, weight_decay=0.01)
    sched = DummyScheduler(opt, total_num_steps=8, warmup_num_steps=3)
    loader = torch.utils.data.DataLoader(torch.randn(8, 8), batch_size=4)
    engine, *_ = acc.prepare(model, opt, loader, sched)
    params, schedule = engine.config.optimizer.params, engine.config.scheduler.params
    assert (params.lr, params.weight_decay) == (explicit_lr or 2e-3, 0.01)
    assert (schedule.warmup_min_lr, schedule.warmup_max_lr) == (0, 2e-3)
    assert (schedule.warmup_num_steps, schedule.total_num_steps) == (3, 8)
    assert config["optimizer"]["params"]["weight_decay"] == "auto"  # the caller's dict is not written into


def _tiny() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def _loader() -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(torch.randn(8, 8, generator=torch.Generator().manual_seed(1)), batch_size=4)


def test_dummy_objects_need_the_configs_sections():
    """As Accelerate refuses them: DummyOptim's and DummyScheduler's settings would be dropped without the config's
    section to fill."""
    from accelerate.utils.deepspeed import DummyOptim, DummyScheduler

    from zero_core.integrations.accelerate import Accelerator

    config = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2}}
    model = _tiny()
    opt = DummyOptim(model.parameters(), lr=5e-3, weight_decay=0.1)
    with pytest.raises(ValueError, match="^DummyOptim needs an 'optimizer' section in the DeepSpeed config; add one "
                                         "or pass a torch optimizer$"):
        Accelerator(zero_config=config, cpu=True).prepare(model, opt, _loader())
    config["optimizer"] = {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}}
    sched = DummyScheduler(opt, total_num_steps=4, warmup_num_steps=2)
    with pytest.raises(ValueError, match="^DummyScheduler needs a 'scheduler' section in the DeepSpeed config"):
        Accelerator(zero_config=config, cpu=True).prepare(model, opt, _loader(), sched)


def test_the_optimizer_goes_to_the_models_prepare_call():
    """The engine is built at the prepare() that gets the model: an optimizer in a later call would not train."""
    from accelerate.utils import DeepSpeedPlugin

    from zero_core.integrations.accelerate import Accelerator

    model = _tiny()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with pytest.raises(ValueError, match="pass the training dataloader to the same prepare"):  # micro "auto"
        Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2), cpu=True).prepare(model)
    acc = Accelerator(zero_config={"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2}}, cpu=True)
    acc.prepare(model)
    with pytest.raises(ValueError, match=r"pass the model, optimizer \(and scheduler, dataloader\) in one prepare"):
        acc.prepare(opt, _loader())


class _Counter:
    def __init__(self, state: object = 0) -> None:
        self.n = state

    def state_dict(self) -> dict:
        return {"n": self.n}

    def load_state_dict(self, state: dict) -> None:
        self.n = state["n"]


def test_registered_objects_are_saved_and_restored(tmp_path, capsys):
    """register_for_checkpointing's objects ride in the checkpoint's JSON client_state; a state JSON would not give
    back is refused at save_state, naming the object. clip_grad_norm_ with another max_norm than the config's
    gradient_clipping says once that the engine clips at the config's."""
    from zero_core.integrations.accelerate import Accelerator

    acc = Accelerator(zero_config={"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 1.0,
                                   "zero_optimization": {"stage": 2}}, cpu=True)
    model = _tiny()
    engine, opt, loader = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2), _loader())
    for batch in loader:
        acc.backward(engine(batch).square().mean())
        norms = [acc.clip_grad_norm_(engine.parameters(), 0.5), acc.clip_grad_norm_(engine.parameters(), 0.5)]
        assert float(norms[0]) == engine.get_global_grad_norm()  # the engine's norm, clipped at 1.0 as configured
    said = [line for line in capsys.readouterr().out.splitlines() if "clip_grad_norm_" in line]
    assert len(said) == 1 and "gradient_clipping (1.0)" in said[0] and "DeepSpeedPlugin(gradient_clipping=" in said[0]

    counter = _Counter({"seen": 7, "best": float("inf"), "history": [1.5, None]})
    acc.register_for_checkpointing(counter)
    acc.save_state(str(tmp_path / "state"))
    counter.n = None
    acc.load_state(str(tmp_path / "state"))
    assert counter.n == {"seen": 7, "best": float("inf"), "history": [1.5, None]}
    acc.register_for_checkpointing(_Counter(torch.zeros(2)))
    with pytest.raises(ValueError, match=r"^registered object 1 \(_Counter\) has a Tensor at state_dict\(\)\['n'\];"):
        acc.save_state(str(tmp_path / "state"))
    with pytest.raises(ValueError, match="holds the states of 1 registered objects and this Accelerator has 2"):
        acc.load_state(str(tmp_path / "state"))
