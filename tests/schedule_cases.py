"""The small model and DeepSpeed config (a config schedule, its AdamW) that the schedule tests compare with
DeepSpeed 0.19.8's CPU numbers."""

from __future__ import annotations

import torch

PARAMS = {
    "WarmupDecayLR": {"total_num_steps": 20, "warmup_max_lr": 0.01, "warmup_num_steps": 3},
    "OneCycle": {"cycle_min_lr": 0.001, "cycle_max_lr": 0.01, "cycle_first_step_size": 3,
                 "cycle_second_step_size": 4, "cycle_min_mom": 0.85, "cycle_max_mom": 0.95},
}


def small_model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def scheduled_config(schedule: str, stage: int, offload: bool) -> dict:
    zero = {"stage": stage, **({"offload_optimizer": {"device": "cpu"}} if offload else {})}
    return {"train_micro_batch_size_per_gpu": 2, "zero_optimization": zero,
            "scheduler": {"type": schedule, "params": PARAMS[schedule]},
            "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01, "torch_adam": True}}}
