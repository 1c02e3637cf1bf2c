"""A DeepSpeed-style script that ends with asynchronous collectives still in flight (never waited for), run under
torchrun by tests/test_comm_release.py: the process must exit cleanly, not abort as the backend's thread releases
their tensors during the interpreter's finalization."""

import sys

import torch

import zero_core.deepspeed as deepspeed
from zero_core.deepspeed import comm as dist

deepspeed.init_distributed()
for i in range(int(sys.argv[1])):
    dist.all_reduce(torch.ones(256) * i, async_op=True)  # tensors made here, dropped at once
