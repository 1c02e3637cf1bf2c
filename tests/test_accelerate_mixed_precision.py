"""zero_core's Accelerator applies `Accelerator(mixed_precision=...)` to the DeepSpeed config as Accelerate's DeepSpeed
path does (DeepSpeedPlugin.set_mixed_precision): a plugin without a bf16 section trains in bf16 when asked.
Expected values: DeepSpeed 0.19.8 + Accelerate on CPU, the same loop under torchrun with DS_ACCELERATOR=cpu on 2
gloo ranks (ZeRO stage 2, gradient_accumulation_steps 2, gradient_clipping 1.0, a model cast to bf16 first so that
both build their fp32 masters from the same weights): rank 0's loss after each micro-batch and the grad norm
clip_grad_norm_ returned at each update."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("accelerate")

from dist_harness import run_ranks  # noqa: E402

from zero_core.integrations.accelerate_config import with_mixed_precision  # noqa: E402


def _loop(rank: int, world: int) -> dict:
    from accelerate.utils import DeepSpeedPlugin

    from zero_core.integrations.accelerate import Accelerator

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    model.to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)
    gen = torch.Generator().manual_seed(5)
    x_all, y_all = torch.randn(16, 6, generator=gen), 3 * torch.randn(16, 3, generator=gen)
    train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x_all, y_all), batch_size=2)
    plugin = DeepSpeedPlugin(zero_stage=2, gradient_accumulation_steps=2, gradient_clipping=1.0)
    acc = Accelerator(deepspeed_plugin=plugin, mixed_precision="bf16", cpu=True)
    model, opt, train = acc.prepare(model, opt, train)
    rows = []
    for x, y in train:
        with acc.accumulate(model):
            loss = (model(x.to(torch.bfloat16)).float() - y).pow(2).mean()
            acc.backward(loss)
            norm = acc.clip_grad_norm_(model.parameters(), 1.0) if acc.sync_gradients else None
        rows.append((float(loss), norm))
    return {"bf16": acc.zero_config["bf16"], "rows": rows}


@pytest.mark.slow  # an Accelerate training run (3.3 s on 2 cores)
def test_bf16_mixed_precision_trains_in_bf16():
    got = run_ranks(_loop, 2)
    assert got["bf16"] == {"enabled": True}
    assert [r[0] for r in got["rows"]] == pytest.approx([7.381222, 0.810459, 9.318046, 7.879719], abs=2e-6)
    assert [r[1] for r in got["rows"][1::2]] == pytest.approx([1.704301, 3.03397], abs=2e-6)


def test_sections_follow_mixed_precision():
    assert with_mixed_precision({}, "no") == {"fp16": {"enabled": False}, "bf16": {"enabled": False}}
    assert with_mixed_precision({}, "fp16")["fp16"] == {"enabled": True, "auto_cast": True}
    auto = {"bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"}}
    assert with_mixed_precision(auto, "bf16") == {"bf16": {"enabled": True}, "fp16": {"enabled": False}}
    assert auto["bf16"] == {"enabled": "auto"}  # the plugin's own config is left as given
    kept = with_mixed_precision({"bf16": {"enabled": False}}, "bf16")  # an explicit value wins, as Accelerate's
    assert kept["bf16"] == {"enabled": False}
    with pytest.raises(ValueError, match="fp16.enabled true disagree"):
        with_mixed_precision({"fp16": {"enabled": True}}, "bf16")
