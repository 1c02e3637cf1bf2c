"""The DeepSpeed-API paths on a GPU, checked against references (a correctness check, not a benchmark).

    source docs/benchmarks/scripts/gpu_env.sh && python3 docs/benchmarks/scripts/deepspeed_api_check.py

Prints one JSON object: for DeepSpeed 0.19.8 ZeRO checkpoints resumed by zero_core (tests/fixtures/deepspeed) and
trained 2 more steps, the largest weight difference from DeepSpeed's own continuation (recorded on the CPU); the
same for FSDP2 DCP saves (tests/fixtures/dcp, accelerate) against FSDP2's continuation; the loss scale after each
step of an fp16 DeepSpeed checkpoint resumed (tests/fixtures/deepspeed_fp16) beside DeepSpeed's; safe_get_full_grad
against torch autograd of the same weights; get_lr() under a WarmupDecayLR the script built.
"""
import json
import sys

import torch

sys.path[:0] = ["tests", "tests/fixtures"]
import make_deepspeed_fp16_fixtures as fp16_fixtures  # noqa: E402
from make_deepspeed_fixtures import CONTINUE_SEED, CONTINUE_STEPS, Tiny  # noqa: E402
from parity_workers import ds_config, make_batches, make_model  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

import zero_core.deepspeed as deepspeed  # noqa: E402
from zero_core.deepspeed.runtime.lr_schedules import WarmupDecayLR  # noqa: E402
from zero_core.deepspeed.utils import safe_get_full_grad  # noqa: E402


def tiny_engine(stage: int, offload: bool, **extra):
    torch.manual_seed(0)
    m = Tiny()
    m.norm.weight.requires_grad_(False)
    zero = {"stage": stage, **({"offload_optimizer": {"device": "cpu"}} if offload else {})}
    cfg = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": zero,
           "optimizer": {"type": "AdamW", "params": {"lr": 0.05, "weight_decay": 0.01}}, **extra}
    return deepspeed.initialize(model=m, model_parameters=[p for p in m.parameters() if p.requires_grad], config=cfg)[0]


def train_on(e, seed: int, steps: int) -> list[float]:
    gen, scales = torch.Generator().manual_seed(seed), []
    for _ in range(steps):
        e.backward(e(torch.randint(0, 11, (4, 5), generator=gen).to(e.device)))
        e.step()
        scales.append(float(e.scaler.scale))
    return scales


out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
for saved, stage, offload in [(2, 3, False), (3, 1, False), (1, 2, True)]:
    e = tiny_engine(stage, offload)
    e.load_checkpoint(f"tests/fixtures/deepspeed/{saved}_2_fp32")
    train_on(e, CONTINUE_SEED, CONTINUE_STEPS)
    full, want = e.full_state_dict(), load_file(f"tests/fixtures/deepspeed/{saved}_2_fp32/continued.safetensors")
    out[f"resume ZeRO-{saved} at stage {stage}{' offload' if offload else ''}: max |diff| vs DeepSpeed"] = max(
        float((full[k] - v).abs().max()) for k, v in want.items())
    e.close()
for save, stage, offload in [("dcp/model_optim", 3, False), ("accelerate/checkpoint-2", 2, True)]:
    e = tiny_engine(stage, offload, gradient_clipping=0.0)  # the FSDP2 run did not clip
    e.load_checkpoint(f"tests/fixtures/{save}")
    train_on(e, CONTINUE_SEED, CONTINUE_STEPS)
    full, want = e.full_state_dict(), load_file("tests/fixtures/dcp/model_optim/continued.safetensors")
    out[f"resume {save} at stage {stage}{' offload' if offload else ''}: max |diff| vs FSDP2"] = max(
        float((full[k] - v).abs().max()) for k, v in want.items())
    e.close()
for saved, stage in [(2, 3), (3, 2)]:
    e = tiny_engine(stage, False, fp16=fp16_fixtures.FP16)
    e.load_checkpoint(f"tests/fixtures/deepspeed_fp16/{saved}")
    got = train_on(e, fp16_fixtures.CONTINUE_SEED, fp16_fixtures.CONTINUE_STEPS)
    want = json.load(open(f"tests/fixtures/deepspeed_fp16/{saved}/continued.json"))["loss_scales"]
    out[f"fp16 ZeRO-{saved} resumed at stage {stage}: loss scales (DeepSpeed's {want})"] = got
    e.close()
for stage, offload in [(2, False), (3, False), (2, True)]:
    zero = {"offload_optimizer": {"device": "cpu"}} if offload else {}
    cfg = ds_config(stage, "fp32", 2, clip=1e-3, **zero)
    model = make_model()
    e, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    ref = make_model().to(e.device)
    ref.load_state_dict(e.full_state_dict())
    x, y = (t.to(e.device) for t in make_batches(1, 2)[0])
    e.backward(e(x, y).loss)
    ref(x, y).loss.backward()
    pairs = [(p, q) for p, q in zip(model.parameters(), ref.parameters()) if p.requires_grad]
    worst = max(float((safe_get_full_grad(p) - q.grad).abs().max()) for p, q in pairs)
    out[f"safe_get_full_grad stage {stage}{' offload' if offload else ''}: max |diff| vs autograd"] = worst
    e.step()
    e.close()
model = make_model()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
cfg = ds_config(2, "bf16", 2)
del cfg["optimizer"]
e, _, _, sched = deepspeed.initialize(model=model, optimizer=opt, config=cfg, lr_scheduler=WarmupDecayLR(
    opt, total_num_steps=6, warmup_max_lr=2e-3, warmup_num_steps=3, warmup_type="linear"))
lrs = []
for x, y in make_batches(4, 2):
    lrs.append(e.get_lr()[0])
    e.backward(e(x.to(e.device), y.to(e.device)).loss)
    e.step()
out["WarmupDecayLR built by the script, get_lr per step"] = lrs
e.close()
print(json.dumps(out, indent=1))
