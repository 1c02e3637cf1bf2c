"""Where one variant's GPU memory goes: phase marks and the allocations alive at the peak, by call site.

    torchrun --nproc-per-node 2 docs/benchmarks/scripts/ab/memory_probe.py SCENARIO VARIANT BATCH [STEPS]

TIMING=1: no allocator history; STEPS micro-steps under the scenario's memory cap, then STEPS without it,
each step's milliseconds and the allocator's retries (a full cache flush and re-allocation on hitting the
cap) printed; dynamic padding as the scenario sets it.

Builds the variant as the scenario runner's worker does (same model, data, DeepSpeed dict), trains
STEPS micro-batches of fixed width (no memory cap: the point is to see the whole peak), and prints on
rank 0: memory allocated after building, after each forward, the peak of each backward and step, and
the blocks alive at the run's peak grouped by the first zbench / zero_core / deepspeed / transformers
frame that allocated them (from torch's allocator history).
"""

from __future__ import annotations

import collections
import os
import sys
import time

import torch

from zbench import ds_config
from zbench.data import build_splits
from zbench.data.batches import train_stream, trim_padding
from zbench.models.factory import build_model
from zbench.plan import build_plan
from zbench.variants import build_variant
from zbench.worker import _cap_memory, _setup

GIB = 2**30
OURS = ("zero_core/", "zbench/", "deepspeed/", "transformers/", "torch/distributed/fsdp/", "torch/optim/")


def site(frames: list[dict]) -> str:
    for f in frames:
        if any(k in f["filename"] for k in OURS) and "memory_probe" not in f["filename"]:
            short = f["filename"].split("site-packages/")[-1].split("/work/")[-1]
            return f"{short}:{f['line']} {f['name']}"
    return "(other)" if not frames else f"{frames[0]['filename'].split('/')[-1]}:{frames[0]['line']} {frames[0]['name']}"


def alive_at_peak(snapshot: dict, device: int) -> tuple[int, dict[str, int]]:
    live: dict[int, tuple[int, str]] = {}
    total = peak = 0
    at_peak: dict[int, tuple[int, str]] = {}
    for ev in snapshot["device_traces"][device]:
        if ev["action"] == "alloc":
            live[ev["addr"]] = (ev["size"], site(ev.get("frames", [])))
            total += ev["size"]
            if total > peak:
                peak, at_peak = total, dict(live)
        elif ev["action"] == "free_completed" and ev["addr"] in live:
            total -= live.pop(ev["addr"])[0]
    by_site: dict[str, int] = collections.Counter()
    for size, where in at_peak.values():
        by_site[where] += size
    return peak, by_site


def model_data(plan, vp, batch: int, world: int):
    """The variant's model, data and finished DeepSpeed dict, as the runner's worker builds them."""
    sc = plan.scenario
    torch.manual_seed(sc.seed)
    bundle = build_model(task=sc.task, arch=vp.arch or plan.arch, pretrained=sc.model.pretrained,
                         num_labels=sc.model.num_labels or 2)
    splits = build_splits(sc.model_dump(mode="json")["data"], task=sc.task, seq_len=sc.seq_len, vocab=bundle.vocab,
                          seed=sc.seed, base_dir=plan.base_dir, tokenizer=None, num_labels=sc.model.num_labels or 2,
                          target_len=sc.target_len)
    ds = ds_config.finalize(vp.ds_template, sc=sc, batch=batch, world_size=world, total_steps=100, hidden=bundle.hidden)
    return bundle, splits, ds


def main() -> None:
    path, name, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
    steps = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    device, rank, world = _setup()
    if device.type != "cuda":  # a dry run of the script's plumbing on the CPU
        for fn in ("_record_memory_history", "reset_peak_memory_stats", "synchronize", "memory_allocated", "max_memory_allocated"):
            setattr(torch.cuda, fn, lambda *a, **k: 0)
            setattr(torch.cuda.memory, fn, lambda *a, **k: 0)
        torch.cuda.memory._snapshot = lambda: {"device_traces": [[]]}
    plan = build_plan(path, only=[name], gpus=world)
    vp, sc = plan.variants[0], plan.scenario
    if rank == 0:
        torch.cuda.memory._record_memory_history(max_entries=3_000_000, stacks="python")
    bundle, splits, ds = model_data(plan, vp, batch, world)
    variant = build_variant(vp.spec.engine, bundle, ds, device)
    torch.cuda.synchronize()
    marks = [f"built: {torch.cuda.memory_allocated() / GIB:.2f} GiB (peak so far {torch.cuda.max_memory_allocated() / GIB:.2f})"]
    stream = train_stream(splits.train, batch=batch, rank=rank, world=world, seed=sc.seed)
    variant.train()
    for i in range(steps):
        b = {k: v.to(device) for k, v in next(stream).items()}
        torch.cuda.reset_peak_memory_stats()
        out = variant.forward(b)
        after_fwd = torch.cuda.memory_allocated()
        fwd_peak = torch.cuda.max_memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        variant.backward(out.loss)
        torch.cuda.synchronize()
        bwd_peak, after_bwd = torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        variant.step()
        torch.cuda.synchronize()
        marks.append(f"step {i}: forward peak {fwd_peak / GIB:.2f}, after forward {after_fwd / GIB:.2f}, backward peak "
                     f"{bwd_peak / GIB:.2f}, after backward {after_bwd / GIB:.2f}, step peak "
                     f"{torch.cuda.max_memory_allocated() / GIB:.2f}, after step {torch.cuda.memory_allocated() / GIB:.2f} GiB")
        del out
    if rank == 0:
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        peak, by_site = alive_at_peak(snap, device.index or 0)
        print(f"== {name} batch {batch} (world {world}, {sc.precision}, seq {sc.seq_len})")
        print("\n".join(marks))
        print(f"peak of the allocation trace: {peak / GIB:.2f} GiB; alive at that moment, by call site:")
        for where, size in sorted(by_site.items(), key=lambda kv: -kv[1])[:25]:
            print(f"  {size / GIB:7.3f} GiB  {where}")
    torch.distributed.destroy_process_group()


def timing(path: str, name: str, batch: int, steps: int) -> None:
    device, rank, world = _setup()
    plan = build_plan(path, only=[name], gpus=world)
    vp, sc = plan.variants[0], plan.scenario
    bundle, splits, ds = model_data(plan, vp, batch, world)
    _cap_memory(device, float(os.environ.get("CAP", sc.gpu_memory_cap_gib or 0)))  # CAP=GiB overrides the scenario's
    variant = build_variant(vp.spec.engine, bundle, ds, device)
    stream = train_stream(splits.train, batch=batch, rank=rank, world=world, seed=sc.seed)
    variant.train()
    for capped in (True, False):
        if not capped:
            torch.cuda.set_per_process_memory_fraction(1.0, device)
        for i in range(steps):
            b = next(stream)
            b = {k: v.to(device) for k, v in (trim_padding(b) if sc.dynamic_padding else b).items()}
            torch.cuda.synchronize()
            t0, r0 = time.perf_counter(), torch.cuda.memory_stats()["num_alloc_retries"]
            out = variant.forward(b)
            variant.backward(out.loss)
            variant.step()
            torch.cuda.synchronize()
            st = torch.cuda.memory_stats()
            if rank == 0:
                print(f"{'cap' if capped else 'no cap'} step {i}: width {b['input_ids'].shape[1]}, "
                      f"{(time.perf_counter() - t0) * 1e3:.1f} ms, alloc retries +{st['num_alloc_retries'] - r0}, "
                      f"reserved {torch.cuda.memory_reserved() / GIB:.2f} GiB, peak {torch.cuda.max_memory_allocated() / GIB:.2f}",
                      flush=True)
            del out
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    if os.environ.get("TIMING"):
        timing(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 6)
    else:
        main()
