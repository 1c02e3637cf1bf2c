"""`engine.no_sync()` as DeepSpeed's: a backward inside it adds its gradients to the next backward's, which reduces
them all (DDP's accumulation pattern), at every stage (DeepSpeed's stages 2-3 refuse it: their expected values are
its stage 0-1 ones, which fp32 SGD makes the same at every stage)."""

from __future__ import annotations

import pytest
import torch
from dist_harness import run_ranks

# DeepSpeed 0.19.8 on CPU, 2 ranks, _train below: the losses, the last layer's bias after the 3 windows and the
# engine's global_steps, for (stage, gradient_accumulation_steps); stages 2-3: DeepSpeed's stage 0 values
_GAS1 = ([0.9860472679138184, 0.5713407397270203, 1.6992148160934448, 0.6288018822669983, 1.0451009273529053,
          0.7116016745567322],
         [0.09265369921922684, 0.03744718059897423, -0.025244738906621933, -0.007400326896458864], 3)
DS_RUNS = {
    (0, 1): _GAS1,
    (1, 1): _GAS1,
    (2, 1): _GAS1,
    (3, 1): _GAS1,
    (0, 2): ([0.9860472679138184, 0.5713407397270203, 1.706573486328125, 0.6189658641815186, 1.0426431894302368,
              0.7118635177612305],
             [0.09128638356924057, 0.034343425184488297, -0.036228395998477936, -0.03449168801307678], 1),
}
DS_RUNS[2, 2] = DS_RUNS[3, 2] = DS_RUNS[0, 2]


def _engine(stage: int, gas: int):
    import zero_core.deepspeed as deepspeed

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": gas,
           "zero_optimization": {"stage": stage}}
    return deepspeed.initialize(model=model, optimizer=opt, config=cfg)[0]


def _train(rank: int, world: int, stage: int, gas: int) -> tuple:
    engine = _engine(stage, gas)
    g = torch.Generator().manual_seed(3)
    losses = []
    for _ in range(3):
        for micro in range(2):
            xs, ys = torch.randn(4 * world, 8, generator=g), torch.randn(4 * world, 4, generator=g)
            loss = torch.nn.functional.mse_loss(engine(xs[4 * rank:4 * rank + 4]), ys[4 * rank:4 * rank + 4])
            if micro == 0:
                with engine.no_sync():
                    engine.backward(loss)
            else:
                engine.backward(loss)
                engine.step()
            losses.append(loss.item())
    out = (losses, engine.full_state_dict()["2.bias"].tolist(), engine.global_steps)
    engine.close()
    return out


@pytest.mark.parametrize("stage, gas", sorted(DS_RUNS))
def test_no_sync_accumulates_into_the_next_backward_as_deepspeed(stage, gas):
    losses, bias, steps = run_ranks(_train, 2, stage, gas)
    want_losses, want_bias, want_steps = DS_RUNS[stage, gas]
    assert losses == pytest.approx(want_losses, abs=1e-6) and bias == pytest.approx(want_bias, abs=1e-6)
    assert steps == want_steps


def test_no_sync_is_entered_once():
    engine = _engine(2, 1)
    with engine.no_sync():
        with pytest.raises(ValueError, match="already open"):
            with engine.no_sync():
                pass
    assert engine.is_gradient_accumulation_boundary()  # the window's own boundary again after the context
    engine.close()
