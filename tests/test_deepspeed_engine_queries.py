"""DeepSpeed engine queries: get_global_grad_norm's type, loss_scale(), engine.config[...], config getters."""

from __future__ import annotations

import pickle

import pytest
import torch

from dist_harness import run_ranks

pytestmark = pytest.mark.slow  # 2 spawned ranks

# DeepSpeed 0.19.8 on CPU (gloo, 2 ranks): one AdamW step, gradient_clipping 1.0 (s10), and its getters (s09)
DS_GLOBAL_NORM = 0.8038811683654785
DS_QUERIES = {"loss_scale": 0.0, "micro": 2, "optimizer_name": "adamw",
              "optimizer_params": {"lr": 0.01, "torch_adam": True}, "scheduler_name": "WarmupLR",
              "scheduler_params": {"warmup_max_lr": 0.01, "warmup_num_steps": 3},
              "allgather": 500000000, "reduce": 500000000, "contiguous": True, "gather16": False}


def _queries(rank: int, world: int, stage: int) -> dict:
    from zero_core import deepspeed

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    cfg = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": stage}, "gradient_clipping": 1.0,
           "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}},
           "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 0.01, "warmup_num_steps": 3}}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    before = engine.get_global_grad_norm()
    engine.backward(engine(torch.randn(2, 6).to(engine.device)).pow(2).mean())
    engine.step()
    norm = engine.get_global_grad_norm()
    return {"before": before, "norm": None if norm is None else (type(norm).__name__, norm.dim(), norm.item()),
            "loss_scale": engine.loss_scale(), "scale_value": float(engine.loss_scale),
            "micro": engine.config["train_micro_batch_size_per_gpu"], "optimizer_name": engine.optimizer_name(),
            "optimizer_params": engine.optimizer_params(), "scheduler_name": engine.scheduler_name(),
            "scheduler_params": engine.scheduler_params(), "allgather": engine.zero_allgather_bucket_size(),
            "reduce": engine.zero_reduce_bucket_size(), "contiguous": engine.zero_contiguous_gradients(),
            "gather16": engine.zero_gather_16bit_weights_on_model_save(),
            "pickled_scale": pickle.loads(pickle.dumps(engine.loss_scale))}


@pytest.mark.parametrize("stage", [0, 2])
def test_engine_queries_match_deepspeed(stage):
    got = run_ranks(_queries, 2, stage)
    assert got["before"] is None
    if stage == 0:
        assert got["norm"] is None  # DeepSpeed's stage 0 runs a torch optimizer, which keeps no norm
    else:
        assert got["norm"][:2] == ("Tensor", 0) and got["norm"][2] == pytest.approx(DS_GLOBAL_NORM, rel=1e-6)
    for key, value in DS_QUERIES.items():
        assert got[key] == value, key
    assert got["scale_value"] == 1.0 and got["pickled_scale"] == 1.0
