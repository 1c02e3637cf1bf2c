"""The residual stream of mingpt_largest's blocks (n_embd 8192, random init), fp32 on the CPU: the largest |x|
after each block, and in which feature, when zero_core's stage 3 runs the model as rank 0 of 2 simulated
(`zbench run --simulate-ranks 2`) and as one whole rank. fp16 holds at most 65,504.

    python docs/benchmarks/scripts/sim_block_growth.py [N_LAYER]   # default 1; the whole run needs ~14 GB per block
"""

import contextlib
import sys

import torch
import torch.distributed as dist

import zero_core
from zbench.models.gpt import GPT, GPTConfig
from zbench.rank_process import setup


@contextlib.contextmanager
def rank_0_of_2():
    setup(simulate=2)  # as `zbench run --simulate-ranks 2` sets up each rank process
    try:
        yield
    finally:
        dist.destroy_process_group()


def block_peaks(simulated: bool, n_layer: int) -> tuple[float, list[tuple[float, int]]]:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=65, block_size=128, n_layer=n_layer, n_head=16, n_embd=8192))
    config = {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
              "zero_optimization": {"stage": 3}}
    with rank_0_of_2() if simulated else contextlib.nullcontext():
        engine = zero_core.initialize(model, config)
        peaks: list[tuple[float, int]] = []
        for block in model.blocks:
            block.register_forward_hook(lambda m, i, out: peaks.append(
                (out.abs().max().item(), int(out.abs().amax(dim=(0, 1)).argmax()))))
        tokens = torch.randint(0, 65, (1, 128), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            loss = float(engine(tokens, tokens).loss)
        engine.close()
    return loss, peaks


if __name__ == "__main__":
    layers = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    for simulated in (True, False):
        loss, peaks = block_peaks(simulated, layers)
        print(f"{'rank 0 of 2, simulated' if simulated else 'one whole rank'}: loss {loss:.3f}; per block "
              + ", ".join(f"max |x| {p:,.1f} (feature {f})" for p, f in peaks), flush=True)
