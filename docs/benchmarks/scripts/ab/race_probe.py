"""Where does stage 2's run-to-run difference with deferred weight gathers come from (CUDA only)?
Each variant trains the same case twice in one process and reports whether the two runs are bitwise equal."""
import sys

sys.path.insert(0, "tests")
import torch  # noqa: E402

from dist_harness import run_ranks  # noqa: E402
from parity_workers import zero_train  # noqa: E402

base = {"stage": 2, "dtype": "fp32", "micro": 2, "gas": 2, "steps": 4, "clip": 1.0, "zero_core": {"overlap_weight_gather": True}}
variants = {
    "as in the test": {},
    "wait_for_weights after step": {"after_step": "wait"},
    "cuda sync after step": {"after_step": "sync"},
    "no caller collective between steps": {"reduce_losses_at_end": True},
}
if __name__ == "__main__":  # the ranks are spawned: they import this file
    for name, extra in variants.items():
        case = {**base, **extra}
        for attempt in range(2):
            a, b = run_ranks(zero_train, 2, [case, case])
            same = a["losses"] == b["losses"] and all(torch.equal(a["state"][k], v) for k, v in b["state"].items())
            diff = max(abs(x - y) for x, y in zip(a["losses"], b["losses"]))
            print(f"{name:40s} try {attempt}: {'bitwise equal' if same else 'DIFFER'} (max loss diff {diff:.3e})", flush=True)
