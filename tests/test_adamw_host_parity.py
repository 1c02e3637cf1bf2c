"""The device's fused AdamW (kernels/triton_adamw.py) gives the bits torch's fused CPU AdamW gives, the kernel the
host update of optimizer offload runs: a chunk updated on the GPU (streamed, or a device share) ends as the host
would have left it. On CPU the Triton kernel runs in the interpreter; with ZB_TEST_DEVICE=cuda it is compiled.

Sizes are multiples of 16, as every range the engine hands either kernel is (the layout's alignment): torch's CPU
kernel rounds the few elements after its last full vector in a scalar loop of its own."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")]

DEVICE = torch.device("cuda" if os.environ.get("ZB_TEST_DEVICE") == "cuda" else "cpu")
N = 3 * 2048 + 16 * 5  # a few of the kernel's blocks and a partial one


def _host(p, g, m, v, *, lr, step, coef, beta1, beta2, eps, weight_decay, decoupled):
    fused = torch._fused_adamw_ if decoupled else torch._fused_adam_
    lr = float(torch.tensor(lr, dtype=torch.float32))  # the engine keeps its lrs in fp32 tensors, and reads them so
    fused([p], [g * coef], [m], [v], [], [torch.tensor(float(step))], lr=lr, beta1=beta1, beta2=beta2,
          weight_decay=weight_decay, eps=eps, amsgrad=False, maximize=False)


def _device(p, g, m, v, out, *, lr, step, coef, beta1, beta2, eps, weight_decay, decoupled):
    from zero_core.kernels import triton_adamw

    f = lambda x, dt=torch.float32: torch.tensor([x], dtype=dt, device=DEVICE)  # noqa: E731
    triton_adamw.adamw_step(p, g, m, v, out, lr=f(lr), step=f(float(step)), coef=f(coef), skip=f(0, torch.int32),
                            beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay, decoupled=decoupled)


@pytest.mark.parametrize("decoupled", [True, False])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
@pytest.mark.parametrize("coef", [1.0, 0.37])  # unclipped, and a clipped step
@pytest.mark.parametrize("beta1", [0.9, 0.3])  # torch's two forms of m.lerp_(g, 1 - beta1)
def test_device_adamw_equals_the_host_bitwise(decoupled, weight_decay, coef, beta1):
    gen = torch.Generator().manual_seed(11)
    p = torch.randn(N, generator=gen)
    m, v = 0.01 * torch.randn(N, generator=gen), 1e-4 * torch.rand(N, generator=gen)
    host = [p.clone(), m.clone(), v.clone()]
    dev = [t.clone().to(DEVICE) for t in host]  # a copy on the CPU too (.to would return the same tensor)
    out = torch.empty(N, dtype=torch.float16, device=DEVICE)
    hyper = dict(lr=3e-4, beta2=0.999, eps=1e-8, weight_decay=weight_decay, decoupled=decoupled, beta1=beta1)
    for step in (1, 2, 7, 1000):  # bias corrections from far below to near one
        grad = torch.randn(N, generator=gen) * 0.05
        _host(*host[:1], grad, *host[1:], step=step, coef=coef, **hyper)
        _device(dev[0], grad.to(DEVICE), dev[1], dev[2], out, step=step, coef=coef, **hyper)
        for name, a, b in zip(("param", "exp_avg", "exp_avg_sq"), host, dev):
            same = a == b.cpu()
            assert bool(same.all()), f"{name} at step {step}: {int((~same).sum())} of {N} elements differ"
        assert torch.equal(out.cpu(), host[0].to(torch.float16))


def _offload_steps(fraction: float, clip: float, steps: int = 3,
                   slow_host: bool = False) -> tuple[list[torch.Tensor], list[torch.Tensor], list[int]]:
    """`steps` updates of a HostAdamW whose gradient shards come from the GPU, `fraction` of its chunks streamed
    through the GPU's kernel; the states, each step's 16-bit output and the host chunks the GPU took in the last
    step (`slow_host`: each host chunk first waits, 10 s at most, until the GPU has taken one)."""
    import time
    from zero_core.optim import HostAdamW, Hyper
    from zero_core.optim.states import TensorStates

    numel, cuda = 5000, torch.device("cuda")
    states = TensorStates(numel, torch.device("cpu"))
    states.master.copy_(torch.randn(numel, generator=torch.Generator().manual_seed(3)))
    opt = HostAdamW(states, comm_dtype=torch.bfloat16, clip=clip, stream_fraction=fraction, hold_grads=True,
                    groups=[Hyper(0.9, 0.95, 1e-8, 0.1), Hyper(0.8, 0.99, 1e-6, 0.0)], decoupled=True,
                    lr_at=lambda a: torch.tensor([1e-2, 3e-3]), shard_stats=False, comm_device=cuda,
                    runs=[[(0, 1536, 0), (1536, 2560, 1)], [(2560, 5000, 0)]])
    adam = opt._adam_pieces

    def slow_adam(*a):
        deadline = time.monotonic() + 10
        while slow_host and not opt.taken_by_device and time.monotonic() < deadline:
            time.sleep(0.001)
        adam(*a)

    opt._adam_pieces = slow_adam
    gen, outs = torch.Generator().manual_seed(5), []
    for _ in range(steps):
        grads = torch.randn(numel, generator=gen).bfloat16().to(cuda)
        opt.begin_pass(torch.ones(1, device=cuda), accumulate=False, final=True)
        for lo, hi in ((2560, 5000), (0, 2560)):
            opt.receive(grads[lo:hi], lo)
        opt.end_pass()
        out = torch.zeros(numel, dtype=torch.bfloat16)
        opt.step(out)
        outs.append(out)
    opt.close()
    return [states.master, states.exp_avg, states.exp_avg_sq], outs, list(opt.taken_by_device)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the streamed update runs on a GPU")
@pytest.mark.parametrize("clip", [0.0, 1e-3])
@pytest.mark.parametrize("slow_host", [False, True])  # True: the GPU takes host chunks (offload_stream_balance)
def test_streamed_chunks_on_the_gpu_equal_the_host_step_bitwise(monkeypatch, clip, slow_host):
    monkeypatch.setenv("ZERO_CORE_HOST_CHUNK_NUMEL", "1024")
    plain, plain_outs, _ = _offload_steps(0.0, clip)
    streamed, outs, taken = _offload_steps(0.5, clip, slow_host=slow_host)
    assert taken or not slow_host
    for name, a, b in zip(("master", "exp_avg", "exp_avg_sq"), plain, streamed):
        assert torch.equal(a, b), f"{name}: {int((a != b).sum())} elements differ"
    assert all(torch.equal(a, b) for a, b in zip(plain_outs, outs))


@pytest.mark.parametrize("scale", [2.0**-14, 0.3])  # a loss scale's power of two (one pass), and any other factor
def test_the_host_rebuilds_a_clipped_gradient_with_the_devices_two_roundings(scale):
    from zero_core.optim import HostAdamW, Hyper
    from zero_core.optim.states import TensorStates

    numel = 4096
    opt = HostAdamW(TensorStates(numel, torch.device("cpu")), comm_dtype=torch.float16, clip=1.0,
                    groups=[Hyper(0.9, 0.95, 1e-8, 0.0)], decoupled=True, lr_at=lambda a: torch.tensor([1e-3]),
                    shard_stats=False, comm_device=torch.device("cpu"), runs=[[(0, numel, 0)]])
    opt.staging.copy_(torch.randn(numel, generator=torch.Generator().manual_seed(2)) * 1e3)
    opt.lazy, opt._lazy_scale = True, scale
    coef = 0.37
    expected = (opt.staging.float() * scale) * coef  # as the device: the rebuilt gradient, then times coef
    assert torch.equal(opt._grad(0, numel, coef=coef), expected)
    opt.close()
