"""zero_core's Accelerator launched on a machine with no accelerator (2 gloo ranks, `cpu` not given, Accelerate told
the gloo backend): the processes are one group, as under Accelerate's DeepSpeed path, so `gather_for_metrics`
collects every rank's results (7 eval samples, the duplicate the sampler pads with dropped) and the updates are
the 2-rank ones. Expected values: DeepSpeed 0.19.8 + Accelerate on CPU, the same loop under torchrun with
DS_ACCELERATOR=cpu (ZeRO stage 2, gradient_accumulation_steps 2, gradient_clipping 1.0, AdamW, a LambdaLR):
rank 0's loss after each micro-batch and the grad norm clip_grad_norm_ returned at each update."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("accelerate")

from dist_harness import run_ranks  # noqa: E402


def _loop(rank: int, world: int) -> dict:
    from accelerate.utils import DeepSpeedPlugin, InitProcessGroupKwargs

    from zero_core.integrations.accelerate import Accelerator

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)
    sch = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    gen = torch.Generator().manual_seed(5)
    x_all, y_all = torch.randn(16, 6, generator=gen), 3 * torch.randn(16, 3, generator=gen)
    train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x_all, y_all), batch_size=2)
    evals = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(7.0)), batch_size=2)
    plugin = DeepSpeedPlugin(zero_stage=2, gradient_accumulation_steps=2, gradient_clipping=1.0)
    acc = Accelerator(deepspeed_plugin=plugin, kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")])
    model, opt, sch, train, evals = acc.prepare(model, opt, sch, train, evals)
    rows = []
    for x, y in train:
        with acc.accumulate(model):
            loss = (model(x) - y).pow(2).mean()
            acc.backward(loss)
            norm = acc.clip_grad_norm_(model.parameters(), 1.0) if acc.sync_gradients else None
            opt.step()
            sch.step()
            opt.zero_grad()
        rows.append((float(loss), norm))
    seen = torch.cat([acc.gather_for_metrics(i) for (i,) in evals])
    return {"processes": acc.num_processes, "rows": rows, "eval": seen.tolist()}


@pytest.mark.slow  # seconds of subprocess launches: the full suite runs it
def test_launched_processes_on_the_host_are_one_group():
    got = run_ranks(_loop, 2)
    assert got["processes"] == 2
    assert got["eval"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]  # DeepSpeed: every rank's, in sample order
    assert [r[0] for r in got["rows"]] == pytest.approx([7.381869, 0.810312, 9.318196, 7.88207], abs=2e-6)
    assert [r[1] is None for r in got["rows"]] == [True, False, True, False]
    assert [r[1] for r in got["rows"][1::2]] == pytest.approx([1.706087, 3.030156], abs=2e-6)
