"""Training loops shared by the parity tests: zero_core on ranks vs a plain single-process reference."""

from __future__ import annotations

import copy
import os
from typing import Any

import torch
import torch.distributed as dist

from zbench.models.gpt import GPT, GPTConfig

TINY = GPTConfig(vocab_size=37, block_size=16, n_layer=2, n_head=2, n_embd=20)
SEQ = 9
DEVICE = torch.device("cuda" if os.environ.get("ZB_TEST_DEVICE") == "cuda" else "cpu")
LR, BETAS, EPS, WD = 1e-3, (0.9, 0.95), 1e-8, 0.1


def make_model(frozen: bool = True) -> GPT:
    torch.manual_seed(1234)
    model = GPT(TINY)
    if frozen:  # a frozen parameter must stay frozen and replicated
        model.blocks[0].ln1.bias.requires_grad_(False)
    return model


def make_batches(steps: int, global_batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(99)
    data = torch.randint(0, TINY.vocab_size, (steps, global_batch, SEQ + 1), generator=g)
    return [(d[:, :-1], d[:, 1:]) for d in data]


def train_local(engine, rank: int, world: int, micro: int, steps: int) -> list[float]:
    """Train `steps` micro-steps on this rank's slice of make_batches; this rank's loss of each."""
    losses = []
    for x, y in make_batches(steps, micro * world):
        xs, ys = (t[rank * micro : (rank + 1) * micro].to(engine.device) for t in (x, y))
        loss = engine(xs, ys).loss
        losses.append(float(loss.detach()))
        engine.backward(loss)
        engine.step()
    return losses


def ds_engine(stage: int, dtype: str, offload: bool = False) -> tuple[Any, GPT]:
    """(engine, model): make_model() under zero_core.deepspeed.initialize with ds_config(stage, dtype, 1), the
    optimizer offloaded to the host with `offload`."""
    import zero_core.deepspeed as deepspeed

    zero = {"offload_optimizer": {"device": "cpu"}} if offload else {}
    model = make_model()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=ds_config(stage, dtype, 1, **zero))
    return engine, model


def ds_config(stage: int, dtype: str, micro: int, gas: int = 1, clip: float = 0.0, **zero: Any) -> dict:
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": gas,
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": list(BETAS), "eps": EPS, "weight_decay": WD}},
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 500, **zero},
    }
    cfg["gradient_clipping"] = clip  # 0: off (DeepSpeed's default clips at 1.0)
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    if dtype == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 8, "hysteresis": 1}
    return cfg


def zero_train(rank: int, world: int, cases: list[dict]) -> list[dict]:
    """For each case: train with zero_core, return mean losses per step and the full fp32 state dict."""
    import zero_core

    from zero_core.optim.states import state_sum

    def sums(engine) -> float:  # streams the states: works wherever they live (device, host, NVMe)
        engine.wait_for_weights()  # the host update may still run after step() (optimizer offload)
        return state_sum(engine.optimizer.states, "master") + state_sum(engine.optimizer.states, "exp_avg")

    results = []
    for case in cases:
        micro, gas = case["micro"], case.get("gas", 1)
        batches = make_batches(case["steps"] * gas, micro * world)
        saved_env = {k: os.environ.get(k) for k in case.get("env", {})}
        os.environ.update(case.get("env", {}))  # e.g. tiny offload chunks, so that a small model has many
        cfg = ds_config(case["stage"], case["dtype"], micro, gas, case.get("clip", 0.0), **case.get("zero", {}))
        if "zero_core" in case:
            cfg["zero_core"] = case["zero_core"]
        engine = zero_core.initialize(make_model(), cfg)
        losses, master_sums = [], [sums(engine)]  # [0]: before training
        for i, (x, y) in enumerate(batches):
            xs, ys = (t[rank * micro : (rank + 1) * micro].to(engine.device) for t in (x, y))
            if case.get("inject_inf_at") == i:
                # poison one rank's gradient: every rank must skip this step together
                hook = engine.module.ln_f.weight.register_hook(lambda g: g * float("inf") if rank == 0 else g)
            loss = engine(xs, ys).loss
            engine.backward(loss)
            if case.get("inject_inf_at") == i:
                hook.remove()
            engine.step()
            if case.get("after_step") == "wait":  # diagnostics: the weight gathers done before anything else
                engine.wait_for_weights()
            elif case.get("after_step") == "sync" and torch.cuda.is_available():
                torch.cuda.synchronize()
            master_sums.append(sums(engine))
            mean = loss.detach().float().clone()
            if case.get("reduce_losses_at_end"):  # no collective of the caller's between the steps
                losses.append(mean)
                continue
            dist.all_reduce(mean)
            losses.append(float(mean) / world)
        if case.get("reduce_losses_at_end"):
            stacked = torch.stack(losses)
            dist.all_reduce(stacked)
            losses = [float(v) / world for v in stacked]
        results.append(
            {
                "losses": losses,
                "master_sums": master_sums,
                "state": engine.full_state_dict(),
                "skipped": engine.skipped_steps,
                "scale": engine.loss_scale,
                "global_step": engine.global_step,
                "frozen_grad": engine.module.blocks[0].ln1.bias.requires_grad,
            }
        )
        engine.close()
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return results


def reference_train(case: dict, world: int) -> dict:
    """Single process, whole global batch per step, torch AdamW on fp32 masters."""
    micro, gas, steps = case["micro"], case.get("gas", 1), case["steps"]
    batches = make_batches(steps * gas, micro * world)
    model = make_model().to(DEVICE)
    master = copy.deepcopy(model)
    params = [p for p in master.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    dtype = torch.bfloat16 if case["dtype"] == "bf16" else torch.float32
    work = copy.deepcopy(model).to(dtype)
    losses = []
    for s in range(steps):
        with torch.no_grad():
            for w, m in zip(work.parameters(), master.parameters()):
                w.copy_(m)
        work.zero_grad()
        loss_sum = 0.0
        for k in range(gas):
            x, y = (t.to(DEVICE) for t in batches[s * gas + k])
            loss = work(x, y).loss
            (loss / gas).backward()
            loss_sum += float(loss.detach())
        for w, m in zip(work.parameters(), master.parameters()):
            m.grad = None if w.grad is None else w.grad.float()
        if case.get("clip"):
            torch.nn.utils.clip_grad_norm_(params, case["clip"])
        opt.step()
        losses.append(loss_sum / gas)
    return {"losses": losses, "state": {k: v.float().cpu() for k, v in master.state_dict().items()}}
