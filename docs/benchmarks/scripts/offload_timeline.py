"""Where an offloaded GPT-2 XL step's time goes: the copy engines' and the compute stream's busy time per phase.

    python3 docs/benchmarks/scripts/offload_timeline.py --set zero_core.offload_stream_fraction=0.55

Seed Table 3's shape and config (scenarios/gpt2xl_offload.yaml: batch 16, seq 128, fp16, 24 GiB cap, the
scenario's DeepSpeed JSON with its "auto" values filled as `zbench run` fills them), with `--set a.b=v` overrides
(JSON values; `--drop a.b` removes a key). It times `--steps` steps after `--warmup`, prints zbench's step-time
breakdown and the peak memory, then profiles two steps and prints, for each phase of the step (the update's tail
after step() returns and the forward, backward, step()), the milliseconds the compute stream, the host-to-device
and the device-to-host copies were busy, and the memory allocated as each phase was queued. `--trace F` writes the
intervals (JSON, the host's ops too) for a closer look.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import time
from pathlib import Path

import torch
import yaml

import zero_core
from zbench import ds_config
from zbench.models.gpt import GPT
from zbench.scenario import Scenario
from zbench.train_demo import preset_config
from zbench.variants.zero import with_overlapped_weight_gather

ROOT = Path(__file__).resolve().parents[3]


def busy(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Milliseconds of [lo, hi) covered by the union of `intervals` (microseconds)."""
    total, end = 0.0, lo
    for s, e in sorted(intervals):
        s, e = max(s, end), min(e, hi)
        if e > s:
            total += e - s
            end = e
    return total / 1e3


def config(overrides: list[str], drops: list[str]) -> dict:
    sc = Scenario.model_validate(yaml.safe_load((ROOT / "scenarios/gpt2xl_offload.yaml").read_text()))
    ds = json.loads((ROOT / "scenarios/configs/zero3_offload_config_accelerate.json").read_text())
    for item in overrides:
        key, value = item.split("=", 1)
        *path, last = key.split(".")
        node = ds
        for p in path:
            node = node.setdefault(p, {})
        node[last] = json.loads(value)
    for key in drops:
        *path, last = key.split(".")
        node = ds
        for p in path:
            node = node[p]
        node.pop(last, None)
    cfg = ds_config.finalize(ds, sc=sc, batch=16, world_size=1, total_steps=1000, hidden=1600)
    return with_overlapped_weight_gather(cfg)  # as zbench run configures its zero_core variants


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--drop", action="append", default=[])
    ap.add_argument("--warmup", type=int, default=12)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--cap-gib", type=float, default=24.0)
    ap.add_argument("--profile", action="store_true", help="also profile two steps (the phase table below)")
    ap.add_argument("--trace")
    ap.add_argument("--host-batches", choices=["device", "pageable", "pinned"], default="device",
                    help="where each step's batch comes from: made on the device once (default), or copied up each "
                         "step from pageable or pinned host memory, as a training loop does")
    args = ap.parse_args()
    cfg = config(args.set, args.drop)
    dev = torch.device("cuda")
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, args.cap_gib * 2**30 / total))
    torch.manual_seed(0)
    with zero_core.init_context({"zero_optimization": {"stage": 3}}):
        model = GPT(preset_config("gpt2-xl"))
    engine = zero_core.initialize(model, cfg)
    print(f"torch threads after initialize: {torch.get_num_threads()} (os.cpu_count {os.cpu_count()})", flush=True)
    gen = torch.Generator(device="cpu").manual_seed(1)
    batches = [torch.randint(0, 50257, (16, 129), generator=gen) for _ in range(4)]
    if args.host_batches == "device":
        batches = [b.to(dev) for b in batches]
    elif args.host_batches == "pinned":
        batches = [b.pin_memory() for b in batches]
    marks: list[tuple[str, float]] = []
    memory: list[tuple[str, int]] = []  # allocated bytes as each profiled phase is queued (no sync)

    losses: list[torch.Tensor] = []

    def step(i: int, mark: bool = False) -> None:
        b = batches[i % len(batches)].to(dev, non_blocking=True)
        if mark:
            marks.append(("forward", time.perf_counter()))
            memory.append(("forward", torch.cuda.memory_allocated()))
        loss = engine(b[:, :-1], b[:, 1:]).loss
        losses.append(loss.detach())
        if mark:
            marks.append(("backward", time.perf_counter()))
            memory.append(("backward", torch.cuda.memory_allocated()))
        engine.backward(loss)
        if mark:
            marks.append(("step", time.perf_counter()))
            memory.append(("step", torch.cuda.memory_allocated()))
        engine.step()

    for i in range(args.warmup):
        step(i)
    torch.cuda.synchronize()
    engine.breakdown.reset()
    torch.cuda.reset_peak_memory_stats()
    times, phases, norms = [], [], []
    for i in range(args.steps):
        t0 = time.perf_counter()
        b = batches[i % len(batches)].to(dev, non_blocking=True)
        loss = engine(b[:, :-1], b[:, 1:]).loss  # waits for the last update's weights, unit by unit
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        engine.backward(loss)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        engine.step()
        engine.wait_for_weights()
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        norms.append(float(engine.get_global_grad_norm()))  # after the timing: a host sync of its own
        times.append((t3 - t0) * 1e3)
        phases.append(((t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3))
    med = [statistics.median(p[k] for p in phases) for k in range(3)]
    print(f"synced phases, median ms: forward {med[0]:.1f}  backward {med[1]:.1f}  step+update {med[2]:.1f}")
    # without a sync per step (as zbench run times it)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(args.steps):
        step(i)
    engine.wait_for_weights()
    torch.cuda.synchronize()
    free_ms = (time.perf_counter() - t0) * 1e3 / args.steps
    summary = engine.breakdown.summary()
    print(f"step ms, synced per step: median {statistics.median(times):.1f}  (min {min(times):.1f})")
    print(f"step ms, back to back: {free_ms:.1f}")
    print("breakdown:", {k: round(v, 1) for k, v in summary.items()})
    print(f"peak GPU GiB: allocated {torch.cuda.max_memory_allocated() / 2**30:.2f}, "
          f"reserved {torch.cuda.max_memory_reserved() / 2**30:.2f}")
    print("skipped steps so far:", getattr(engine, "skipped_steps", "?"))
    # whether an exact update could start before backward ends: only while clipping leaves the gradients as they are
    clip = engine.gradient_clipping()
    print(f"global grad norms of the synced steps (gradient_clipping {clip}): "
          + " ".join(f"{n:.3g}" for n in norms) + f"; clipping engaged in {sum(n > clip > 0 for n in norms)}"
          f" of {len(norms)}")
    host = getattr(engine.optimizer, "host_opt", engine.optimizer)  # the host share's HostAdamW, if any
    if getattr(host, "streamed", None) is not None:  # zero_core.offload_stream_balance
        print(f"host chunks the GPU took in the last update: {len(host.taken_by_device)} of "
              f"{-(-host.states.numel // host.chunk) - len(host._streamed_starts)} (its own: "
              f"{len(host._streamed_starts)})")
    print("training losses (every step, the A/B's check that a setting changed no numbers):",
          " ".join(f"{float(x):.6f}" for x in losses))

    if not args.profile:
        return
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        t_origin = time.perf_counter()
        with torch.profiler.record_function("origin"):
            pass
        for i in range(3):
            step(i, mark=True)
        marks.append(("end", time.perf_counter()))
        engine.wait_for_weights()
        torch.cuda.synchronize()
    events = prof.events()
    origin = next(e for e in events if e.name == "origin").time_range.start  # us, the profiler's clock
    to_us = lambda t: origin + (t - t_origin) * 1e6  # noqa: E731
    kinds: dict[str, list[tuple[float, float]]] = {"h2d": [], "d2h": [], "compute": [], "other": []}
    per_stream: dict[int, list[tuple[float, float]]] = {}
    for e in events:
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        iv = (e.time_range.start, e.time_range.end)
        name = e.name
        sid = getattr(e, "device_resource_id", 0)
        per_stream.setdefault(sid, []).append(iv)
        if "HtoD" in name:
            kinds["h2d"].append(iv)
        elif "DtoH" in name:
            kinds["d2h"].append(iv)
        else:
            kinds["other"].append(iv)
    compute_sid = max(per_stream, key=lambda s: busy(per_stream[s], 0, 1e30))
    kinds["compute"] = per_stream[compute_sid]
    spans = [(n, to_us(t)) for n, t in marks[-10:]]  # the last two steps' forward, backward, step, then end
    print(f"phase ms over the last two profiled steps (compute stream {compute_sid}):")
    print(f"{'phase':10s} {'wall':>8s} {'compute':>8s} {'h2d':>8s} {'d2h':>8s}")
    for (name, lo), (_, hi) in zip(spans, spans[1:]):
        cols = [busy(kinds[k], lo, hi) for k in ("compute", "h2d", "d2h")]
        print(f"{name:10s} {(hi - lo) / 1e3:8.1f} " + " ".join(f"{c:8.1f}" for c in cols))
    print("allocated GiB as each phase was queued:", " ".join(f"{n} {b / 2**30:.2f}" for n, b in memory[-6:]))
    for sid, iv in sorted(per_stream.items()):
        print(f"stream {sid}: busy {busy(iv, spans[0][1], spans[-1][1]):.1f} ms over the two steps, {len(iv)} ops")
    if args.trace:
        with gzip.open(args.trace, "wt") as f:
            json.dump({"marks": spans, "kinds": kinds,
                       "streams": {str(k): v for k, v in per_stream.items()},
                       "names": [(e.name[:60], e.time_range.start, e.time_range.end,
                                  getattr(e, "device_resource_id", 0)) for e in events
                                 if e.device_type == torch.autograd.DeviceType.CUDA],
                       "host": [(e.name[:60], e.time_range.start, e.time_range.end, e.thread) for e in events
                                if e.device_type == torch.autograd.DeviceType.CPU]}, f)


if __name__ == "__main__":
    main()
