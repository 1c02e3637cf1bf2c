"""A stage-3 forward's host cost on the CPU: a 48-block GPT (GPT-2 XL's module count, 438 modules) at tiny width,
one rank, the minimum forward time over 30 steps after 10. Used to time the forward hooks stage 3 puts on modules.

    python3 docs/benchmarks/scripts/stage3_forward_bench.py LABEL [TREE]

With TREE (a `git archive` of another commit), that tree's zero_core, zbench and checkpoints are imported instead
of the installed ones: Python runs without site (-S), so an editable install's import hook cannot win, with
torch's site-packages after TREE on the path.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig

if len(sys.argv) > 2:  # run again on the other tree, isolated from the editable install
    code = (f"import sys; sys.path[:0] = [{sys.argv[2]!r}, {sysconfig.get_paths()['purelib']!r}]; "
            f"sys.argv = [{__file__!r}, {sys.argv[1]!r}]; exec(open({__file__!r}).read())")
    sys.exit(subprocess.call([sys.executable, "-S", "-c", code], env={**os.environ, "WORLD_SIZE": "1"}))

import dataclasses  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

import zero_core  # noqa: E402
from zbench.models.gpt import GPT  # noqa: E402
from zbench.train_demo import preset_config  # noqa: E402

os.environ.setdefault("WORLD_SIZE", "1")
torch.manual_seed(0)
shape = dataclasses.replace(preset_config("gpt2-xl"), n_embd=32, n_head=2, vocab_size=64, block_size=16)
config = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
          "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
with zero_core.init_context({"zero_optimization": {"stage": 3}}):
    model = GPT(shape)
engine = zero_core.initialize(model, config)
batch = torch.randint(0, 64, (2, 9))
times = []
for step in range(40):
    start = time.perf_counter()
    loss = engine(batch[:, :-1], batch[:, 1:]).loss
    forward_ms = (time.perf_counter() - start) * 1e3
    engine.backward(loss)
    engine.step()
    if step >= 10:
        times.append(forward_ms)
print(f"{sys.argv[1]} ({zero_core.__file__}): forward ms, min of {len(times)}: {min(times):.2f}; "
      f"last loss {loss.item():.6f}")
