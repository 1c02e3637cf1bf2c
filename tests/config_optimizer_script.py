"""A training script written against DeepSpeed's API whose optimizer (and for one case its scheduler) comes from the
config, run once with `import deepspeed` (tests/fixtures/make_config_optimizer_fixtures.py, on the CPU) and once
with `import zero_core.deepspeed as deepspeed` (tests/test_config_optimizers.py). `ds` is the imported module.

fp32 throughout, a small MLP, 4 samples per step from a generator per rank, 5 steps at a ZeRO stage. Each step
records the rank-averaged loss and the lr the engine reports after it; the run ends with the weights.
"""

from __future__ import annotations

import torch
from rank_mean_step import step_with_mean_loss

STEPS, GLOBAL_BATCH = 5, 4
RANGE_TEST = {"type": "LRRangeTest", "params": {"lr_range_test_min_lr": 0.02, "lr_range_test_step_size": 2,
                                                "lr_range_test_step_rate": 1.5}}
# name: (optimizer section, ZeRO stage, world size, scheduler section or None)
CASES = {
    "sgd_momentum_stage1": ({"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01}}, 1, 1,
                            None),
    "sgd_nesterov_stage2": ({"type": "SGD", "params": {"lr": 0.05, "momentum": 0.8, "nesterov": True}}, 2, 1, None),
    "adagrad_stage1": ({"type": "Adagrad", "params": {"lr": 0.05, "initial_accumulator_value": 0.1}}, 1, 1, None),
    "adagrad_stage2": ({"type": "adagrad", "params": {"lr": 0.05, "weight_decay": 0.01, "lr_decay": 0.01}}, 2, 1,
                       None),
    "sgd_momentum_stage2_world2": ({"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9}}, 2, 2, None),
    "sgd_range_test_stage2": ({"type": "SGD", "params": {"lr": 0.5, "momentum": 0.5}}, 2, 1, RANGE_TEST),
}


def config(name: str) -> dict:
    optimizer, stage, world, scheduler = CASES[name]
    cfg = {
        "train_micro_batch_size_per_gpu": GLOBAL_BATCH // world,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,  # DeepSpeed asks for it for SGD under ZeRO
        "optimizer": optimizer,
        "steps_per_print": 1000,
    }
    if scheduler is not None:
        cfg["scheduler"] = scheduler
    return cfg


def run(ds, rank: int, world: int, name: str) -> dict:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    engine, *_ = ds.initialize(model=net, model_parameters=net.parameters(), config=config(name))
    g = torch.Generator().manual_seed(1 + rank)
    micro = GLOBAL_BATCH // world
    losses, lrs = [], []
    for _ in range(STEPS):
        x, y = torch.randn(micro, 6, generator=g), torch.randn(micro, 3, generator=g)
        loss = torch.nn.functional.mse_loss(engine(x), y)
        losses.append(step_with_mean_loss(engine, loss, world))
        lrs.append([float(lr) for lr in engine.get_lr()])
    with ds.zero.GatheredParameters(list(net.parameters())):
        weights = {k: v.detach().float().cpu().clone().flatten().tolist() for k, v in net.state_dict().items()}
    return {"losses": losses, "lrs": lrs, "weights": weights}
