"""A training script that builds its model inside `deepspeed.zero.Init` with a bf16 ZeRO-3 config, run once with
`import deepspeed` (the fixtures, made offline by tests/fixtures/make_zero_init_bf16_fixtures.py) and once with
`import zero_core.deepspeed as deepspeed` (tests/test_deepspeed_zero_init_dtype.py). `ds` is the imported module.

The model mixes the initialisations whose bf16 values differ from rounded fp32 ones: Linear's kaiming_uniform_
drawn in bf16, a normal_ initialisation, a LayerNorm's ones and zeros, a torch.full, and buffers made by a
converted factory (`torch.randn`), by arithmetic on an integer range, and an integer one. The script records the
dtypes inside the context and after initialize, the initial fp32 masters (safe_get_full_fp32_param), the
rank-averaged loss of each step and the masters after the last step.
"""

from __future__ import annotations

import torch
from rank_mean_step import step_with_mean_loss

GLOBAL_BATCH, STEPS, IN, WIDTH, OUT = 8, 3, 32, 64, 8


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(IN, WIDTH)
        self.norm = torch.nn.LayerNorm(WIDTH)
        self.register_buffer("noise", torch.randn(3))  # torch.randn: converted by zero.Init
        self.register_buffer("scale", torch.arange(4) * 0.1)  # an integer range times a float: not converted
        self.register_buffer("count", torch.arange(4))
        # the model's own parameters, re-initialised before its __init__ ends: DeepSpeed has partitioned a finished
        # child module's parameters by then, and a write into those outside GatheredParameters is lost there
        self.head = torch.nn.Parameter(torch.empty(OUT, WIDTH))
        torch.nn.init.normal_(self.head, std=0.3)
        self.head_bias = torch.nn.Parameter(torch.full((OUT,), 0.01))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(torch.tanh(self.norm(self.a(x))), self.head, self.head_bias)


def config(world: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": GLOBAL_BATCH // world,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 3},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01, "torch_adam": True}},
        "gradient_clipping": 0.0,
        "steps_per_print": 1000,
    }


def _dtypes(net: torch.nn.Module) -> dict[str, str]:
    return {n: str(t.dtype) for n, t in [*net.named_parameters(), *net.named_buffers()]}


def _masters(ds, net: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: ds.utils.safe_get_full_fp32_param(p).detach().cpu().clone() for n, p in net.named_parameters()}


def run(ds, rank: int, world: int) -> dict:
    cfg = config(world)
    torch.manual_seed(0)
    with ds.zero.Init(config_dict_or_path=cfg):
        net = Net()
        inside = _dtypes(net)
    engine, *_ = ds.initialize(model=net, model_parameters=net.parameters(), config=cfg)
    params_after = {n: str(p.dtype) for n, p in net.named_parameters()}
    initial = _masters(ds, net)
    g = torch.Generator().manual_seed(1 + rank)
    losses = []
    for _ in range(STEPS):
        x = torch.randn(GLOBAL_BATCH // world, IN, generator=g).bfloat16()
        y = torch.randn(GLOBAL_BATCH // world, OUT, generator=g).bfloat16()
        loss = torch.nn.functional.mse_loss(engine(x).float(), y.float())
        losses.append(step_with_mean_loss(engine, loss, world))
    return {"inside": inside, "params_after": params_after, "initial": initial, "losses": losses,
            "final": _masters(ds, net)}
