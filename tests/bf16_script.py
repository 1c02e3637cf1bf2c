"""A bf16 training script written against DeepSpeed's API, run once with `import deepspeed` (the fixtures, made
offline by tests/fixtures/make_bf16_fixtures.py) and once with `import zero_core.deepspeed as deepspeed`
(tests/test_deepspeed_bf16.py). Nothing here knows which one it drives: `ds` is the imported module.

Two Linear layers cast to bf16 before `initialize` (so both engines build their fp32 masters from the same bf16
weights), bf16 micro-batches from a generator per rank (a global batch of 8), a loss taken in fp32. The optimizer is
torch's fused AdamW with weight decay, passed in: the arithmetic of zero_core's CPU AdamW, so that what is
compared is what each engine does around the update (reduction, accumulation, norm, clipping, stage-0 wrapper),
not torch's fused against its for-loop AdamW (an fp32 ulp apart in about 4% of the updated weights, enough to
round some bf16 weights the other way). Each step records the rank-averaged loss and the engine's global
gradient norm; the run ends with the weights.
"""

from __future__ import annotations

import itertools

import torch
import torch.distributed as dist

GLOBAL_BATCH, STEPS, IN, WIDTH, OUT = 8, 4, 32, 64, 8
CLIPS = ("off", "default", "0.3")  # gradient_clipping 0.0; not set (DeepSpeed's 1.0, about the norms here); 0.3
CASES = list(itertools.product((0, 1, 2, 3), CLIPS, (1, 2), (1, 2)))  # stage, clipping, world size, micro-steps


def case_name(stage: int, clip: str, world: int, accum: int) -> str:
    return f"stage{stage}_clip-{clip}_world{world}_accum{accum}"


def config(stage: int, world: int, clip: str, accum: int) -> dict:
    cfg = {
        "train_micro_batch_size_per_gpu": GLOBAL_BATCH // world // accum,
        "gradient_accumulation_steps": accum,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": stage},
        "steps_per_print": 1000,
    }
    if clip != "default":
        cfg["gradient_clipping"] = 0.0 if clip == "off" else float(clip)
    return cfg


def micro_batches(rank: int, micro: int, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's bf16 inputs and targets, `micro` samples each, drawn in turn from its own generator."""
    g = torch.Generator().manual_seed(1 + rank)
    return [(torch.randn(micro, IN, generator=g).bfloat16(), torch.randn(micro, OUT, generator=g).bfloat16())
            for _ in range(count)]


def run(ds, rank: int, world: int, stage: int, clip: str, accum: int) -> dict:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(IN, WIDTH), torch.nn.Tanh(), torch.nn.Linear(WIDTH, OUT))
    net.to(torch.bfloat16)
    opt = torch.optim.AdamW(net.parameters(), lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, fused=True)
    engine, *_ = ds.initialize(model=net, optimizer=opt, config=config(stage, world, clip, accum))
    data = iter(micro_batches(rank, GLOBAL_BATCH // world // accum, STEPS * accum))
    losses, norms = [], []
    for _ in range(STEPS):
        total = torch.zeros(())
        for _ in range(accum):
            x, y = next(data)
            loss = torch.nn.functional.mse_loss(engine(x).float(), y.float())
            engine.backward(loss)
            engine.step()
            total += loss.detach() / accum
        if world > 1:
            dist.all_reduce(total)
        losses.append(float(total) / world)
        norm = engine.get_global_grad_norm()
        norms.append(None if norm is None else float(norm))
    with ds.zero.GatheredParameters(list(net.parameters())):
        weights = {k: v.detach().float().cpu().clone() for k, v in net.state_dict().items()}
    return {"losses": losses, "norms": norms, "weights": weights}
