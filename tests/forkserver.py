"""The tests' fork server: one process that imported torch, zero_core and zbench's run path once, from which
test ranks (dist_harness.run_ranks) and `zbench` commands (forked_cli.run_zbench) are forked. Each child is a
fresh fork of that server, so no state of the test process or of earlier tests reaches it, and no child pays
the imports (seconds each on a 2-core machine, hundreds of times a suite). A child gets the test's environment
passed explicitly: the server's own is the one it started with."""

from __future__ import annotations

import multiprocessing

# torch._dynamo: a torch optimizer's first add_param_group imports it, seconds on its own
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "zero_core", "zbench.cli", "zbench.worker",
           "zbench.train_demo"]
multiprocessing.set_forkserver_preload(PRELOAD)
CONTEXT = multiprocessing.get_context("forkserver")
