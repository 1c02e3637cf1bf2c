"""`zbench train`: train a GPT on synthetic tokens with zero_core on N local ranks.

The smallest end-to-end job: it launches ranks through torch's own elastic launcher, trains, and
prints per-step losses and the throughput. The scenario runner builds its tables on the same path.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass

import torch

from .data.synthetic import synthetic_tokens
from .models.gpt import GPT, GPTConfig
from .models.registry import REGISTRY_DIR


def preset_config(name: str) -> GPTConfig:
    """A shipped GPT shape by name (the model registry, zbench/model_configs/), e.g. tiny, gpt2, gpt2-xl."""
    from .models.configs import gpt_config, load_arch

    return gpt_config(load_arch(name, REGISTRY_DIR))


@dataclass(frozen=True)
class TrainJob:
    """Everything a rank needs; plain data so it crosses the process boundary."""

    ds_config: dict
    model: dict
    steps: int
    seq_len: int
    seed: int = 0
    warmup: int = 0


def default_ds_config(stage: int, micro_batch: int, precision: str, lr: float = 3e-3, grad_accum: int = 1) -> dict:
    """The DeepSpeed-style config `zbench train` uses when no --config file is given."""
    cfg: dict = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": grad_accum,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": lr, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
        "zero_optimization": {"stage": stage},
    }
    if precision in ("bf16", "fp16"):
        cfg[precision] = {"enabled": True}
    return cfg


def run_rank(job: TrainJob) -> dict:
    """One rank's training loop (the launcher's entrypoint); returns rank 0's summary."""
    import zero_core

    from .variants.zero import with_overlapped_weight_gather

    torch.manual_seed(job.seed)
    model = GPT(GPTConfig(**job.model))
    engine = zero_core.initialize(model, with_overlapped_weight_gather(job.ds_config))  # reads no weight mid-loop
    micro = engine.config.train_micro_batch_size_per_gpu
    gen = torch.Generator().manual_seed(job.seed + 1)
    vocab = job.model["vocab_size"]
    losses: list[torch.Tensor] = []  # kept on the device: reading them every step would stall it
    gas = engine.gradient_accumulation_steps()
    every = max(1, job.steps // 10)
    start = time.perf_counter()
    for micro_step in range((job.steps + job.warmup) * gas):
        if micro_step == job.warmup * gas:  # time only steady-state steps
            if engine.device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            engine.breakdown.reset()
        data = synthetic_tokens(gen, engine.world_size * micro, job.seq_len + 1, vocab)[
            engine.rank * micro : (engine.rank + 1) * micro
        ]
        x, y = data[:, :-1].to(engine.device), data[:, 1:].to(engine.device)
        loss = engine(x, y).loss
        engine.backward(loss)
        engine.step()
        if engine.micro_steps % gas == 0:
            losses.append(loss.detach())
            if engine.rank == 0 and (engine.global_step % every == 0 or engine.global_step == 1):
                print(
                    f"step {engine.global_step:>5}  loss {float(loss.detach()):.4f}  lr {engine.get_lr()[0]:.2e}",
                    flush=True,
                )
    engine.wait_for_weights()  # the last update may still run on the host (optimizer offload): it counts
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    tokens = job.steps * engine.config.train_batch_size * job.seq_len
    peak = torch.cuda.max_memory_allocated() / 2**30 if engine.device.type == "cuda" else float("nan")
    breakdown = engine.breakdown.summary()  # ms per timed step (offload runs; {} otherwise)
    engine.close()
    return {
        "peak_gib": peak,
        "step_ms": 1e3 * elapsed / job.steps,
        "stage": engine.stage,
        "world_size": engine.world_size,
        "steps": job.steps,
        "warmup": job.warmup,
        "first_loss": float(losses[0]),
        "final_loss": float(losses[-1]),
        "tokens_per_s": tokens / elapsed,
        "trainable_params": engine.layout.numel,
        "breakdown": breakdown,
    }


def _entry(job_json: str) -> dict:
    job = TrainJob(**json.loads(job_json))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
    return run_rank(job)


def launch(job: TrainJob, nproc: int, fork_ok: bool = False) -> dict:
    """Run `job` on `nproc` local ranks through torch's elastic launcher; return rank 0's summary.

    `fork_ok`: this process has run no torch op, so CPU ranks may be forked (see zbench/launch.py)."""
    from .launch import Nodes
    from .launch import launch as launch_ranks

    results = launch_ranks(
        _entry,
        json.dumps(asdict(job)),
        Nodes(nproc),
        run_id=f"zbench-train-{os.getpid()}",
        log_dir=None,
        what="zbench train",
        fork_ok=fork_ok,
    )
    return results[0]
