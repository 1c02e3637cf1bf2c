"""A training script in the style of DeepSpeed's own examples (CIFAR-style: argparse with DeepSpeed's
arguments, the accelerator, the engine's dataloader, the rank and precision queries, `deepspeed.comm`,
log_dist, a checkpoint with client state and its reload), with `import zero_core.deepspeed as deepspeed`
in place of `import deepspeed`. Run alone or under torchrun; prints one JSON line on rank 0."""

from __future__ import annotations

import argparse
import json
import sys

import torch

import zero_core.deepspeed as deepspeed
from zero_core.deepspeed import comm as dist
from zero_core.deepspeed.accelerator import get_accelerator
from zero_core.deepspeed.utils import log_dist


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--save", required=True)
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args(argv)
    deepspeed.init_distributed()
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 16), torch.randint(0, 4, (64,)))
    net = Net()
    engine, optimizer, loader, _ = deepspeed.initialize(args=args, model=net, model_parameters=net.parameters(),
                                                        training_data=data)
    dtype = torch.bfloat16 if engine.bfloat16_enabled() else torch.half if engine.fp16_enabled() else None
    device = get_accelerator().device_name(engine.local_rank)
    losses = []
    for epoch in range(args.epochs):
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            out = engine(x.to(dtype) if dtype is not None else x)
            loss = torch.nn.functional.cross_entropy(out.float(), y)
            engine.backward(loss)
            engine.step()
            losses.append(float(loss.detach()))
        log_dist(f"epoch {epoch} loss {losses[-1]:.4f} lr {engine.get_lr()[0]:g}", ranks=[0])
    engine.save_checkpoint(args.save, client_state={"epoch": args.epochs})
    seen = torch.tensor([len(losses)], dtype=torch.float32)
    dist.all_reduce(seen)
    _, client = engine.load_checkpoint(args.save)
    if dist.get_rank() == 0:
        print(json.dumps({"world": dist.get_world_size(), "steps": engine.global_steps, "first": losses[0],
                          "last": losses[-1], "client": client, "seen": float(seen[0]),
                          "micro": engine.train_micro_batch_size_per_gpu(), "dp": engine.dp_world_size}))
    engine.destroy()


if __name__ == "__main__":
    main(sys.argv[1:])
