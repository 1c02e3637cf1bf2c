"""One rank of one variant: build data, model and engine; train, evaluate, measure; report to rank 0.

This is the launcher's entrypoint (`run_job`), so it imports only torch and zbench's training pieces:
no pandas, matplotlib or W&B in the rank processes (W&B only in rank 0 of a training launch, zbench/live_log.py).
A probe (the batch search) runs a few steps and
returns; an out-of-memory error propagates, so the launcher stops every rank and reports it.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import time
from typing import Any

import torch
import torch.distributed as dist

from . import ds_config
from .data import build_splits
from .data.batches import eval_batches, steps_per_epoch, train_stream, trim_padding, widest_batch
from .evaluation import EvalSums
from .generation import TextGeneration
from .live_log import LiveLog
from .models.configs import ArchConfig
from .models.compiled import compile_blocks, graphs_compiled
from .models.factory import build_model, uses_dropout
from .progress import ProgressWriter
from .rank_process import apply_alloc_conf, cap_memory, peaks, reduce_across_ranks, setup, sync
from .resume import Checkpointing
from .scenario import Scenario
from .variants import build_variant


def _finish_update(variant: Any) -> None:
    """zero_core's optimizer offload may leave the last host update running after step(): wait for it."""
    wait = getattr(getattr(variant, "engine_obj", None), "wait_for_weights", None)
    if wait is not None:
        wait()


def run_job(job_json: str) -> dict[str, Any]:
    """Entry point of every rank; rank 0 returns the full summary, the others their rank."""
    job = json.loads(job_json)
    for sig in (signal.SIGTERM, signal.SIGINT):  # a forked rank inherits the agent's raising handlers
        signal.signal(sig, signal.SIG_DFL)
    apply_alloc_conf(job["scenario"].get("cuda_alloc_conf"))
    device, rank, world = setup(job["scenario"].get("comm_timeout_s"), job.get("simulate_world"))
    # On an error the process group goes with the process: taking it down first would close this rank's
    # connections before its own error is recorded, and a peer's "connection closed" would be reported instead.
    summary = _run(job, device, rank, world)
    dist.destroy_process_group()
    return summary


def _sharded_init(job: dict[str, Any], pretrained: str | None) -> Any:
    """zero_core at stage 3 builds a random-init model sharded (zero_core.init_context): a model larger than
    host memory (a model-search candidate) is never whole on any rank, and its weights are those of eager
    building."""
    stage = (job.get("ds") or {}).get("zero_optimization", {}).get("stage", 0)
    if job.get("engine") == "zero" and stage == 3 and job["mode"] != "floor" and not pretrained:
        import zero_core

        return zero_core.init_context({"zero_optimization": {"stage": 3}})
    return contextlib.nullcontext()


def _run(job: dict[str, Any], device: torch.device, rank: int, world: int) -> dict[str, Any]:
    sc = Scenario.model_validate(job["scenario"])
    cap_memory(device, sc.gpu_memory_cap_gib)
    arch = ArchConfig(**job["arch"]) if job["arch"] else None
    torch.manual_seed(sc.seed)  # the same initial weights in every variant
    with _sharded_init(job, sc.model.pretrained):
        bundle = build_model(
            task=sc.task, arch=arch, pretrained=sc.model.pretrained, num_labels=sc.model.num_labels or 2
        )
    if job.get("recompute", sc.gradient_checkpointing):  # the variant's own setting, else the scenario's
        bundle.model.gradient_checkpointing_enable()
    if job.get("compile"):
        compile_blocks(bundle, job["compile"])
    splits = build_splits(
        job["scenario"]["data"],
        task=sc.task,
        seq_len=sc.seq_len,
        vocab=bundle.vocab,
        seed=sc.seed,
        base_dir=job["base_dir"],
        tokenizer=sc.model.tokenizer or sc.model.pretrained,
        num_labels=sc.model.num_labels or 2,
        target_len=sc.target_len,
    )
    batch = job["batch"]
    if job["mode"] == "floor":  # one rank: forward+backward alone plus the optimizer phase (zbench/floor.py)
        from . import floor

        if device.type == "cpu":  # one rank's share of the cores, as each rank of the real run has
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // job["world_size"]))

        first = {
            k: v.to(device)
            for k, v in next(train_stream(splits.train, batch=batch, rank=0, world=1, seed=sc.seed)).items()
        }
        return {
            "rank": 0,
            **floor.measure(bundle, first, sc.precision, job["world_size"], device),
            "compiled": job.get("compile"),
        }
    gas = sc.grad_accum
    probe = job["mode"] in ("probe", "eval_probe")
    # the eval batch search: one optimizer step, then a few eval batches
    eval_probe = job["mode"] == "eval_probe"
    run_micro, run_epochs = _schedule(sc, splits.train, batch, world)
    micro_per_epoch, epochs = (
        ((1 if eval_probe else sc.batch_search.steps) * gas, 1) if probe else (run_micro, run_epochs)
    )
    total_steps = epochs * micro_per_epoch // gas
    ds = ds_config.finalize(
        job["ds"], sc=sc, batch=batch, world_size=world, total_steps=total_steps, hidden=bundle.hidden
    )
    variant = build_variant(job["engine"], bundle, ds, device)
    texts = TextGeneration.for_run(
        sc.task, splits.tokenizer, bundle.model, variant.forward, sc.target_len or sc.seq_len
    )
    torch.manual_seed(sc.seed + 1 + rank)  # dropout differs per rank, identically in every variant
    stream = train_stream(splits.train, batch=batch, rank=rank, world=world, seed=sc.seed)
    if probe and sc.dynamic_padding:  # OOM-safe search: every probe step runs the widest batch of the real run
        stream = itertools.repeat(
            widest_batch(
                splits.train, batch=batch, rank=rank, world=world, seed=sc.seed, micro_steps=run_micro * run_epochs
            )
        )
    progress = ProgressWriter(job.get("progress") if rank == 0 else None)
    live = LiveLog(None if probe else job.get("wandb"), rank, world, device)  # W&B per optimizer step, rank 0
    eval_bs = job.get("eval_batch") or sc.eval_batch_size or batch
    n_eval = -(-next(iter(splits.eval.values())).shape[0] // (eval_bs * world))
    losses: list[torch.Tensor] = []  # kept on the device: reading each would stall it
    skips: list = []  # skipped optimizer steps so far, after each optimizer step (parity compares the patterns)
    ckpt = Checkpointing(job.get("checkpoint_dir"), sc.checkpoint_every, gas, variant)
    done = ckpt.resume(losses, device)
    epoch_rows = []
    skip_micro = (
        sc.timing_skip_steps * gas if not probe and done == 0 and sc.timing_skip_steps * gas < micro_per_epoch else 0
    )
    steady_start = None
    timer = getattr(getattr(variant, "engine_obj", None), "breakdown", None)  # zero_core's step-time breakdown
    breakdown: dict[str, float] = {}
    shape = trim_padding if sc.dynamic_padding else (lambda b: b)
    wall_start = time.time()
    for epoch in range(epochs):
        variant.train()
        sync(device)
        start = time.perf_counter()
        live.start_timing()
        tokens = steady_tokens = rows = 0  # positions computed on this rank (padding included, as the GPU runs them)
        for i in range(micro_per_epoch):
            b = {k: v.to(device, non_blocking=True) for k, v in shape(next(stream)).items()}
            if epoch * micro_per_epoch + i < done:  # already trained before the checkpoint: only advance the data
                continue
            width = b["input_ids"].numel()
            tokens += width
            rows += b["input_ids"].shape[0]
            steady_tokens += width if steady_start is not None else 0
            out = variant.forward(b)
            variant.backward(out.loss)
            variant.step()
            losses.append(out.loss.detach().float())
            if (i + 1) % gas == 0:
                stats = variant.step_stats()
                live.optimizer_step(losses[-gas:], stats, width * gas, epoch + (i + 1) / micro_per_epoch)
                skips.append(stats.get("skipped_steps"))  # a device tensor: read once, at the end
            if epoch == 0 and skip_micro and i + 1 == skip_micro:  # steady state starts here (one sync)
                sync(device)
                steady_start = time.perf_counter()
                if timer is not None:
                    timer.reset()  # the breakdown covers the same steady steps as the step time
            ckpt.after_micro_step(epoch * micro_per_epoch + i + 1, losses)
            progress.update(f"train epoch {epoch + 1}/{epochs}", i + 1, micro_per_epoch)
        _finish_update(variant)  # zero_core offload at stages 1-2: the last host update is part of the timed steps
        sync(device)
        end = time.perf_counter()
        train_s = end - start
        if epoch == 0 and timer is not None:
            breakdown = timer.summary()  # offload runs: where rank 0's step time went ({} when off)
        steady = (
            {}
            if epoch or steady_start is None
            else {
                "steady_s": end - steady_start,
                "steady_steps": (micro_per_epoch - skip_micro) // gas,
                "steady_tokens": steady_tokens,
            }
        )
        if probe and not eval_probe:
            epoch_rows.append({"train_s": train_s, "tokens": tokens, "rows": rows})
            break
        variant.eval()
        sums = EvalSums(sc.task, device, bleu=texts is not None)
        start = time.perf_counter()
        with torch.no_grad():
            for j, (b, valid) in enumerate(eval_batches(splits.eval, batch=eval_bs, rank=rank, world=world)):
                if eval_probe and j == sc.batch_search.steps:  # the first batches are full: enough to fit or not
                    break
                b = {k: v.to(device, non_blocking=True) for k, v in shape(b).items()}
                out = variant.forward(b)
                sums.add(out.logits, b["labels"], valid)
                if texts is not None:  # seq2seq on real text: greedy outputs for BLEU
                    sums.add_texts(*texts.texts(b, valid))
                progress.update(f"eval epoch {epoch + 1}/{epochs}", j + 1, n_eval)
        sync(device)
        eval_s = time.perf_counter() - start
        result = sums.result()
        live.evaluated(result, eval_s)
        epoch_rows.append(
            {"train_s": train_s, "eval_s": eval_s, "eval": result, "tokens": tokens, "rows": rows, **steady}
        )
    wall_end = time.time()
    simulated = bool(job.get("simulate_world"))  # one process for all ranks: its own values stand for theirs
    curve = reduce_across_ranks(epoch_rows, losses, world, simulated, device)
    peak_gpu, peak_cpu = peaks(device)
    if rank != 0:
        return {"rank": rank}
    skipped = variant.step_stats().get("skipped_steps")
    skipped = None if skipped is None else int(float(skipped))
    live.finish(
        {
            "train/train_runtime": sum(r["train_s"] for r in epoch_rows),
            "peak_gpu_gib": peak_gpu,
            "peak_cpu_gib": peak_cpu,
            "skipped_steps": skipped,
        }
    )
    tokens_per_row = sc.seq_len + ((sc.target_len or sc.seq_len) if sc.task == "seq2seq" else 0)
    if sc.dynamic_padding:  # the mean width the batches were cut to (what attention's FLOPs scale with);
        # rows trained, not rows per epoch: a resumed run skips the steps before its checkpoint
        tokens_per_row = sum(r["tokens"] for r in epoch_rows) / max(1, sum(r["rows"] for r in epoch_rows))
    return {
        "rank": 0,
        "status": "ok",
        "world_size": world,
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "batch": batch,
        "eval_batch": eval_bs,
        "grad_accum": gas,
        "micro_steps_per_epoch": micro_per_epoch,
        "epochs": epoch_rows,
        "losses": curve.tolist(),
        "tokens_per_epoch": round(micro_per_epoch * batch * world * tokens_per_row),
        "tokens_per_row": tokens_per_row,
        "n_params": bundle.n_params,
        "largest_layer": bundle.largest_layer,
        "layers": bundle.layers,
        "hidden": bundle.hidden,
        "peak_gpu_gib": peak_gpu,
        "peak_cpu_gib": peak_cpu,
        "skipped_steps": skipped,
        # per optimizer step; unknown when a resumed run did not see the steps before its checkpoint
        "skipped_by_step": None if done or None in skips else [int(float(x)) for x in skips],
        "wandb_live": live.folder,
        "train_wall": [wall_start, wall_end],
        "ds_config": ds,
        "data": splits.description,
        "data_real": splits.real,
        "torch": torch.__version__,
        "recompute": _recomputes(bundle.model),
        "breakdown": breakdown,
        "dynamic_padding": sc.dynamic_padding,
        "compiled": job.get("compile"),
        "compiled_graphs": graphs_compiled() if job.get("compile") else 0,
        "dropout": uses_dropout(bundle.model),
        "simulated": simulated,
    }


def _schedule(sc: Scenario, train: dict, batch: int, world: int) -> tuple[int, int]:
    """(micro-steps per epoch, epochs) of the training run: `steps` as one epoch, or whole epochs of the data."""
    gas = sc.grad_accum
    if sc.steps:
        return sc.steps * gas, 1
    return max(gas, steps_per_epoch(train, batch, world) // gas * gas), sc.epochs or 1


def _recomputes(model: torch.nn.Module) -> bool:
    """Whether the model as trained recomputes its blocks in backward (zbench's GPT or a transformers model)."""
    return bool(getattr(model, "gradient_checkpointing", False) or getattr(model, "is_gradient_checkpointing", False))
