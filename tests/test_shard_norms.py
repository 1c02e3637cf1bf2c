"""The lazy pass's gradient statistics: one norm per reduced shard, summed at the step."""

from __future__ import annotations

import math

import torch

from zero_core.optim.shard_norms import ShardNorms


def test_sum_of_squares_and_non_finite_count_over_many_shards():
    norms = ShardNorms(torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    shards = [torch.randn(50 + i, generator=gen).half() for i in range(150)]  # more than the first buffer holds
    norms.begin(0.25)
    for s in shards:
        norms.add(s)
    total, bad = norms.stats().tolist()
    expect = sum((float(s.float().norm()) * 0.25) ** 2 for s in shards)
    assert math.isclose(total, expect, rel_tol=1e-5) and bad == 0
    norms.begin(1.0)  # a new pass forgets the last one's shards
    norms.add(torch.tensor([3.0, 4.0]))
    norms.add(torch.tensor([float("inf"), 1.0]))
    norms.add(torch.tensor([float("nan")]))
    total, bad = norms.stats().tolist()
    assert bad == 2 and not math.isfinite(total)
    norms.begin(1.0)
    assert norms.stats().tolist() == [0.0, 0.0]  # a pass with no lazy shard
