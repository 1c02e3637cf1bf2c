"""A training script written against DeepSpeed's API, run once with `import deepspeed` (the fixtures, made
offline by tests/fixtures/make_dropin_fixtures.py) and once with `import zero_core.deepspeed as deepspeed`
(tests/test_deepspeed_dropin.py). Nothing here knows which one it drives: `ds` is the imported module.

Hugging Face-style groups (no weight decay for biases and LayerNorm weights), AdamW from the config,
WarmupDecayLR from the config or a torch LambdaLR passed in; phase A trains 10 steps on 2 ranks and saves,
phase B loads on 1 rank and trains 5 more, at the same global batch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

GLOBAL_BATCH, STEPS_A, STEPS_B, VOCAB, WIDTH = 4, 10, 5, 37, 24
NO_DECAY = ("bias", "LayerNorm.weight")


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.dense = torch.nn.Linear(WIDTH, WIDTH)
        self.LayerNorm = torch.nn.LayerNorm(WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(x + torch.tanh(self.dense(x)))


class TinyLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.layers = torch.nn.ModuleList(Block() for _ in range(2))
        self.head = torch.nn.Linear(WIDTH, VOCAB)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return torch.nn.functional.cross_entropy(self.head(x).flatten(0, 1), labels.flatten())


def batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(11)
    return [
        (
            torch.randint(0, VOCAB, (GLOBAL_BATCH, 8), generator=g),
            torch.randint(0, VOCAB, (GLOBAL_BATCH, 8), generator=g),
        )
        for _ in range(steps)
    ]


def config(stage: int, world: int, sched: str) -> dict:
    cfg = {
        "train_micro_batch_size_per_gpu": GLOBAL_BATCH // world,
        "gradient_accumulation_steps": 1,
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": 1e-2, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.1, "torch_adam": True},
        },
        "zero_optimization": {"stage": stage},
        "steps_per_print": 1000,
        "checkpoint": {"load_universal": world == 1},
    }
    if sched == "decay":
        cfg["scheduler"] = {
            "type": "WarmupDecayLR",
            "params": {
                "warmup_min_lr": 0.0,
                "warmup_max_lr": 1e-2,
                "warmup_num_steps": 3,
                "total_num_steps": STEPS_A + STEPS_B,
            },
        }
    return cfg


def groups(model: torch.nn.Module) -> list[dict]:
    named = list(model.named_parameters())
    return [
        {"params": [p for n, p in named if not any(k in n for k in NO_DECAY)], "weight_decay": 0.1},
        {"params": [p for n, p in named if any(k in n for k in NO_DECAY)], "weight_decay": 0.0},
    ]


def lambda_schedule(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 4) * 0.9**s)


def _weights(ds, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    with ds.zero.GatheredParameters(list(model.parameters())):
        return {k: v.detach().float().cpu().clone() for k, v in model.state_dict().items()}


def _train(engine, rank: int, world: int, span: range) -> list[float]:
    micro, data, losses = GLOBAL_BATCH // world, batches(STEPS_A + STEPS_B), []
    for s in span:
        ids, labels = data[s]
        loss = engine(ids[rank * micro : (rank + 1) * micro], labels[rank * micro : (rank + 1) * micro])
        engine.backward(loss)
        engine.step()
        mean = loss.detach().clone()
        if dist.is_initialized() and world > 1:
            dist.all_reduce(mean)
        losses.append(float(mean) / world)
    return losses


def run(ds, rank: int, world: int, stage: int, sched: str, ckpt: str, phase: str) -> dict:
    """Phase "a": 10 steps and a save; phase "b": load on this world and 5 more steps; "full": 15 steps
    without a break (what a correct resume continues)."""
    torch.manual_seed(1234)
    model = TinyLM()
    engine, optimizer, _, scheduler = ds.initialize(
        model=model,
        model_parameters=groups(model),
        config=config(stage, world, sched),
        lr_scheduler=lambda_schedule if sched == "lambda" else None,
    )
    if phase == "full":
        losses = _train(engine, rank, world, range(STEPS_A + STEPS_B))
    elif phase == "a":
        losses = _train(engine, rank, world, range(STEPS_A))
        engine.save_checkpoint(ckpt, tag="step10", client_state={"next": STEPS_A})
    else:
        _, client = engine.load_checkpoint(ckpt, tag="step10")
        assert client["next"] == STEPS_A
        losses = _train(engine, rank, world, range(STEPS_A, STEPS_A + STEPS_B))
    return {"losses": losses, "weights": _weights(ds, model), "lr": [float(x) for x in engine.get_lr()]}
