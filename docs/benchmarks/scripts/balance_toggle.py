"""Seed Table 3's step with `zero_core.offload_stream_balance` toggled every few steps in one engine: an A/B
without the process-to-process spread (memory placement, the host's neighbours). On a GPU, from the repo root:

    python3 docs/benchmarks/scripts/balance_toggle.py 0.6     # the streamed fraction S

Model, batch and config as offload_timeline.py builds them (the scenario's zero_core variant at S). After 6
warm-up steps, 12 blocks alternate balance off and on: one step after each switch, then 4 steps timed back to back.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import zero_core  # noqa: E402
from offload_timeline import config  # noqa: E402
from zbench.models.gpt import GPT  # noqa: E402
from zbench.train_demo import preset_config  # noqa: E402


def main(fraction: str) -> None:
    cfg = config([f"zero_core.offload_stream_fraction={fraction}"], [])
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, 24 * 2**30 / total))
    torch.manual_seed(0)
    with zero_core.init_context({"zero_optimization": {"stage": 3}}):
        model = GPT(preset_config("gpt2-xl"))
    engine = zero_core.initialize(model, cfg)
    host = getattr(engine.optimizer, "host_opt", engine.optimizer)  # the host share's HostAdamW
    gen = torch.Generator(device="cpu").manual_seed(1)
    batches = [torch.randint(0, 50257, (16, 129), generator=gen).cuda() for _ in range(4)]

    def run(n: int) -> None:
        for i in range(n):
            b = batches[i % len(batches)]
            engine.backward(engine(b[:, :-1], b[:, 1:]).loss)
            engine.step()
        engine.wait_for_weights()
        torch.cuda.synchronize()

    run(6)
    results: dict[bool, list[float]] = {False: [], True: []}
    for block in range(12):
        host.balance = block % 2 == 1
        run(1)
        t0 = time.perf_counter()
        run(4)
        ms = (time.perf_counter() - t0) * 1e3 / 4
        results[host.balance].append(ms)
        print(f"S {fraction} block {block} balance {host.balance}: {ms:.1f} ms/step, "
              f"took {len(host.taken_by_device)}", flush=True)
    for balance, ms in results.items():
        print(f"S {fraction} balance {balance}: median {statistics.median(ms):.1f} mean {statistics.mean(ms):.1f} "
              f"min {min(ms):.1f} over {len(ms)} blocks")


if __name__ == "__main__":
    main(sys.argv[1])
