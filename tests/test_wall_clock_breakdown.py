"""`wall_clock_breakdown: true` prints DeepSpeed's timing lines at each step() on rank 0: the micro-step line
every step, the optimizer line and the window's line at each update; nothing when it is false."""

from __future__ import annotations

import re

import pytest
import torch

import zero_core.deepspeed as deepspeed

_MICRO = "fwd_microstep bwd_microstep bwd_inner_microstep bwd_allreduce_microstep step_microstep".split()
_WINDOW = "fwd bwd bwd_inner bwd_allreduce step".split()
# DeepSpeed 0.19.8 on CPU, one rank, gradient_accumulation_steps 2, four forward/backward/step micro-steps: the
# timer names of each printed line (all of them "[Rank 0] time (ms) | name: 0.58 | ..."), in order
DS_LINES = {
    0: [_MICRO, _MICRO, _WINDOW] * 2,
    1: [_MICRO, ["optimizer_allgather", "optimizer_gradients", "optimizer_step"], _MICRO, _WINDOW] * 2,
    3: [_MICRO, ["optimizer_step"], _MICRO, _WINDOW] * 2,
}
DS_LINES[2] = DS_LINES[1]
_LINE = re.compile(r"\[Rank 0\] time \(ms\)((?: \| [a-z_]+: \d+\.\d\d)+)")


def _run(stage: int, on: bool) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "zero_optimization": {"stage": stage},
           "wall_clock_breakdown": on, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    for _ in range(4):
        loss = torch.nn.functional.mse_loss(engine(torch.randn(2, 8)), torch.randn(2, 4))
        engine.backward(loss)
        engine.step()


def _timer_lines(out: str) -> list[list[str]]:
    lines = [line for line in out.splitlines() if "time (ms)" in line]
    assert all(_LINE.fullmatch(line) for line in lines), lines
    return [[item.split(":")[0] for item in _LINE.fullmatch(line).group(1).split(" | ")[1:]] for line in lines]


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_the_lines_deepspeed_prints(stage, capsys):
    _run(stage, True)
    # zero_core's gradient pass is inside its optimizer_step: it has no optimizer_gradients to print
    expected = [[n for n in names if n != "optimizer_gradients"] for names in DS_LINES[stage]]
    assert _timer_lines(capsys.readouterr().out) == expected


def test_nothing_when_off(capsys):
    _run(2, False)
    assert "time (ms)" not in capsys.readouterr().out
