"""The scenario runner's training loop for one variant as rank 0 of N simulated ranks on one GPU.

    SIM_WORLD=2 python docs/benchmarks/scripts/ab/sim_run.py SCENARIO VARIANT BATCH

Runs zbench.worker's own loop (data, memory cap, epochs, evaluation) on the job the runner would
launch, with sim_world.py's fake process group: the epoch times are the run's without communication
(a lower bound for a real N-rank run), the peak is rank 0's. COMPILE=1 compiles the blocks (inductor)
whatever the scenario says.
The scenario's cuda_alloc_conf is applied before CUDA starts, as the runner's ranks do.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from sim_world import setup_simulated  # noqa: E402


def main() -> None:
    path, name, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
    world = int(os.environ.get("SIM_WORLD", "2"))
    from zbench import worker
    from zbench.plan import build_plan
    from zbench.runner import variant_job

    plan = build_plan(path, only=[name], simulate=world)  # starts no CUDA: the allocator setting still applies
    worker.apply_alloc_conf(plan.scenario.cuda_alloc_conf)
    device, rank, world = setup_simulated(world)
    vp = plan.variants[0]
    job = variant_job(plan, vp, vp.arch or plan.arch, batch, "train")
    if os.environ.get("COMPILE"):
        job["compile"] = "inductor"
    res = worker._run(job, device, rank, world)
    keep = ("batch", "micro_steps_per_epoch", "peak_gpu_gib", "skipped_steps", "tokens_per_row", "compiled")
    print(json.dumps({k: res.get(k) for k in keep}))
    for i, e in enumerate(res["epochs"]):
        steps = res["micro_steps_per_epoch"]
        print(f"epoch {i + 1}: train {e['train_s']:.2f} s ({e['train_s'] / steps * 1e3:.1f} ms/step), "
              f"eval {e['eval_s']:.2f} s, tokens {e['tokens']}")
    print(f"loss first/last: {res['losses'][0]:.4f} / {res['losses'][-1]:.4f}")


if __name__ == "__main__":
    main()
