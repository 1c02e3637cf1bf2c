"""Where one variant's GPU memory goes: phase marks and the allocations alive at the peak, by call site.

    torchrun --nproc-per-node 2 docs/benchmarks/scripts/ab/memory_probe.py SCENARIO VARIANT BATCH [STEPS]

SIM_WORLD=N (python, no torchrun): rank 0 of N simulated on one GPU (sim_world.py). COMPILE=1: each
block's forward through torch.compile. TIMING=1: no allocator history; STEPS micro-steps under the scenario's memory cap, then STEPS without it,
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
from zbench.variants import build_variant
from zbench.worker import _cap_memory

sys.path.insert(0, os.path.dirname(__file__))
from sim_world import compile_blocks, plan_for, setup_from_env  # noqa: E402

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
    device, rank, world = setup_from_env()
    if device.type != "cuda":  # a dry run of the script's plumbing on the CPU
        for fn in ("_record_memory_history", "reset_peak_memory_stats", "synchronize", "memory_allocated", "max_memory_allocated"):
            setattr(torch.cuda, fn, lambda *a, **k: 0)
            setattr(torch.cuda.memory, fn, lambda *a, **k: 0)
        torch.cuda.memory._snapshot = lambda: {"device_traces": [[]]}
    plan = plan_for(path, name, world)
    vp, sc = plan.variants[0], plan.scenario
    if rank == 0:
        torch.cuda.memory._record_memory_history(max_entries=3_000_000, stacks="python")
    bundle, splits, ds = model_data(plan, vp, batch, world)
    compile_blocks(bundle)
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
    device, rank, world = setup_from_env()
    plan = plan_for(path, name, world)
    vp, sc = plan.variants[0], plan.scenario
    bundle, splits, ds = model_data(plan, vp, batch, world)
    compile_blocks(bundle)
    _cap_memory(device, float(os.environ.get("CAP", sc.gpu_memory_cap_gib or 0)))  # CAP=GiB overrides the scenario's
    variant = build_variant(vp.spec.engine, bundle, ds, device)
    stream = train_stream(splits.train, batch=batch, rank=rank, world=world, seed=sc.seed)
    variant.train()
    uncapped_ms: list[float] = []
    for capped in (True, False):
        if not capped:
            torch.cuda.set_per_process_memory_fraction(1.0, device)
        for i in range(steps):
            b = next(stream)
            b = {k: v.to(device) for k, v in (trim_padding(b) if sc.dynamic_padding else b).items()}
            torch.cuda.synchronize()
            t0, r0 = time.perf_counter(), torch.cuda.memory_stats()["num_alloc_retries"]
            try:
                out = variant.forward(b)
                variant.backward(out.loss)
                variant.step()
                torch.cuda.synchronize()
            except torch.OutOfMemoryError:
                if rank == 0:
                    print(f"{'cap' if capped else 'no cap'} step {i}: out of memory "
                          f"(reserved {torch.cuda.memory_reserved() / GIB:.2f} GiB)", flush=True)
                break
            ms = (time.perf_counter() - t0) * 1e3
            st = torch.cuda.memory_stats()
            if not capped and i >= 2:
                uncapped_ms.append(ms)
            if rank == 0:
                print(f"{'cap' if capped else 'no cap'} step {i}: width {b['input_ids'].shape[1]}, {ms:.1f} ms, "
                      f"loss {out.loss.item():.4f}, alloc retries +{st['num_alloc_retries'] - r0}, "
                      f"reserved {torch.cuda.memory_reserved() / GIB:.2f} GiB, peak {torch.cuda.max_memory_allocated() / GIB:.2f}",
                      flush=True)
            del out
    if os.environ.get("FLOOR") and uncapped_ms and rank == 0:  # the runner's floor for the same batch and world
        from zbench import floor

        step_ms = sorted(uncapped_ms)[len(uncapped_ms) // 2]
        del variant
        torch.cuda.empty_cache()
        fresh, _, _ = model_data(plan, vp, batch, world)
        compile_blocks(fresh)
        first = {k: v.to(device) for k, v in next(train_stream(splits.train, batch=batch, rank=0, world=1, seed=sc.seed)).items()}
        f = floor.measure(fresh, first, sc.precision, world, device)
        total = f["fwd_bwd_ms"] + f["optimizer_ms"]
        print(f"median step (no cap, steps 2+) {step_ms:.1f} ms; floor: forward+backward {f['fwd_bwd_ms']:.1f} ms + "
              f"optimizer {f['optimizer_ms']:.1f} ms = {total:.1f} ms; step / floor {step_ms / total:.3f}x", flush=True)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    if os.environ.get("TIMING"):
        timing(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 6)
    else:
        main()
