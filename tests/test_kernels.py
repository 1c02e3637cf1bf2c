"""zero_core.kernels: reference vs torch.optim, Triton (interpreter) vs reference, flags, skip, dispatch."""

import importlib.util
import random

import pytest
import torch

import zero_core.kernels as K
from zero_core.kernels import reference as R

HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
if HAS_TRITON:
    from zero_core.kernels import triton_adamw, triton_epilogue

    # a few blocks of either kernel plus a remainder
    FEW_BLOCKS = 3 * max(triton_adamw.BLOCK, triton_epilogue.BLOCK) + 17
else:
    FEW_BLOCKS = 3 * 4096 + 17
SIZES = [1, 7, 1000, 4097, 10007, FEW_BLOCKS]
HALF = (torch.bfloat16, torch.float16)


def _gen() -> tuple[int, torch.Generator]:
    """A fresh seed per case (reported in assertion messages) and its generator."""
    seed = random.SystemRandom().randrange(2**31)
    return seed, torch.Generator().manual_seed(seed)


def _ordered(t: torch.Tensor) -> torch.Tensor:
    """16-bit floats as integers ordered like the values, so adjacent floats differ by 1."""
    i = t.view(torch.int16).to(torch.int32)
    return torch.where(i < 0, -(i & 0x7FFF), i)


def assert_close_out(a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor, msg: str) -> None:
    """fp32: within 1e-6 of |b| + scale; 16-bit: within one ulp (the interpreter may round the cast differently).
    ``scale`` is the magnitude of the inputs: when p - update cancels, an FMA (torch's CPU kernels,
    Triton on GPU) against separate roundings (the interpreter's numpy) differs by ulps of the inputs."""
    assert a.dtype == b.dtype, msg
    if a.dtype in HALF:
        ulps = (_ordered(a) - _ordered(b)).abs().max().item()
        assert ulps <= 1, f"{msg}: {ulps} ulp apart"
    else:
        err = ((a - b).abs() / (b.abs() + scale)).max().item()
        assert err <= 1e-6, f"{msg}: relative error {err:.3g}"


def _scalars(lr: float = 1e-3, step: float = 1.0, coef: float = 1.0, skip: int = 0) -> dict:
    f = lambda x: torch.tensor([x], dtype=torch.float32)  # noqa: E731
    return dict(lr=f(lr), step=f(step), coef=f(coef), skip=torch.tensor([skip], dtype=torch.int32))


def _adam_state(n: int, g: torch.Generator) -> list[torch.Tensor]:
    """param, grad, exp_avg, exp_avg_sq with realistic magnitudes (v >= 0)."""
    return [torch.randn(n, generator=g), torch.randn(n, generator=g),
            0.1 * torch.randn(n, generator=g), 0.01 * torch.rand(n, generator=g)]


def _poisoned(n: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.full((n,), float("nan"), dtype=dtype)


# ---------------------------------------------------------------- reference vs torch.optim


@pytest.mark.parametrize("decoupled", [True, False])
def test_reference_matches_torch_optim(decoupled: bool) -> None:
    seed, g = _gen()
    n, wd, lr = 1000, 0.1, 1e-2
    p0 = torch.randn(n, generator=g)
    p = p0.clone()
    m, v = torch.zeros(n), torch.zeros(n)
    tp = torch.nn.Parameter(p0.clone())
    cls = torch.optim.AdamW if decoupled else torch.optim.Adam
    opt = cls([tp], lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=wd, foreach=False)
    for step, coef in ((1, 1.0), (2, 0.37), (3, 2.5)):
        grad = torch.randn(n, generator=g)
        grad_before = grad.clone()
        R.adamw_step(p, grad, m, v, None, **_scalars(lr, step, coef), beta1=0.9, beta2=0.999,
                     eps=1e-8, weight_decay=wd, decoupled=decoupled)
        assert torch.equal(grad, grad_before)
        tp.grad = grad * coef  # what a clip by `coef` leaves in .grad
        opt.step()
        st = opt.state[tp]
        for name, ours, theirs in (("param", p, tp.detach()), ("exp_avg", m, st["exp_avg"]),
                                   ("exp_avg_sq", v, st["exp_avg_sq"])):
            torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7,
                                       msg=f"{name} step {step} seed {seed}")


@pytest.mark.parametrize("decoupled", [True, False])
@pytest.mark.parametrize("out_dtype", [None, torch.bfloat16])
def test_cpu_fused_path_matches_reference(monkeypatch, decoupled: bool, out_dtype) -> None:
    """The host kernel used for CPU training and optimizer offload computes what the reference does."""
    from zero_core.kernels import cpu

    seed, g = _gen()
    n = 10007
    ref = [torch.randn(n, generator=g) for _ in range(1)] + [torch.zeros(n), torch.zeros(n)]
    ours = [t.clone() for t in ref]
    outs = [None if out_dtype is None else torch.empty(n, dtype=out_dtype) for _ in range(2)]
    # Adam + L2 adds weight_decay * param to the gradient: where the sum nearly cancels, its rounding (fused or
    # not) is most of it, and the update lr * g / (|g| + eps) follows that noise; such elements (about 0.2%)
    # are held to the size of the updates instead of to float rounding
    cancelled = torch.zeros(n, dtype=torch.bool)
    for step, coef in ((1, 1.0), (2, 0.37), (3, 2.5)):
        grad = torch.randn(n, generator=g)
        if not decoupled:
            cancelled |= (grad * coef + 0.1 * ref[0]).abs() < 1e-3
        kw = dict(**_scalars(3e-3, step, coef), beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, decoupled=decoupled)
        R.adamw_step(ref[0], grad, ref[1], ref[2], outs[0], **kw)
        cpu.adamw_step(ours[0], grad, ours[1], ours[2], outs[1], **kw)
    assert int(cancelled.sum()) < n // 100, f"seed {seed}"
    torch.testing.assert_close(ours[0][cancelled], ref[0][cancelled], rtol=0, atol=2 * 3 * 3e-3, msg=f"seed {seed}")
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a[~cancelled], b[~cancelled], rtol=1e-6, atol=1e-7, msg=f"seed {seed}")
    if out_dtype is not None:
        assert torch.equal(outs[1], ours[0].to(out_dtype))


@pytest.mark.parametrize("rdtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("accumulate", [False, True])
def test_cpu_epilogue_matches_reference(rdtype, accumulate: bool) -> None:
    from zero_core.kernels import cpu

    seed, g = _gen()
    n = 4099
    reduced, acc0 = torch.randn(n, generator=g).to(rdtype), torch.randn(n, generator=g)
    outs = []
    for fn in (R.reduce_epilogue, cpu.reduce_epilogue):
        acc, sumsq, nf = acc0.clone(), torch.tensor([2.0]), torch.zeros(1, dtype=torch.int32)
        fn(reduced, acc, torch.tensor([0.25]), accumulate, sumsq, nf)
        outs.append((acc, sumsq, nf))
    assert torch.equal(outs[0][0], outs[1][0]), f"seed {seed}"
    torch.testing.assert_close(outs[0][1], outs[1][1], rtol=1e-5, atol=0)
    assert int(outs[1][2]) == 0


# ---------------------------------------------------------------- Triton vs reference


@needs_triton
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("out_dtype", [None, torch.bfloat16, torch.float16, torch.float32])
def test_adamw_triton_matches_reference(monkeypatch, n: int, out_dtype) -> None:
    seed, g = _gen()
    decoupled = n % 2 == 1  # both variants across the size list
    beta1 = 0.0 if n == 7 else 0.9  # beta1 == 0 (no momentum) is legal
    hp = dict(beta1=beta1, beta2=0.999, eps=1e-8, weight_decay=0.05, decoupled=decoupled)
    sc = _scalars(lr=3e-4, step=float(torch.randint(1, 1000, (1,), generator=g)), coef=0.8)
    state = _adam_state(n, g)
    results = {}
    for backend in ("torch", "triton"):
        monkeypatch.setenv("ZERO_CORE_KERNELS", backend)
        p, grad, m, v = (t.clone() for t in state)
        out = None if out_dtype is None else _poisoned(n, out_dtype)
        K.adamw_step(p, grad, m, v, out, **sc, **hp)
        assert torch.equal(grad, state[1]), f"grad modified, seed {seed}"
        results[backend] = (p, m, v, out)
    msg = f"n={n} out={out_dtype} seed={seed}"
    p, grad, m, v = (t.abs() for t in state)
    scales = (p, m + grad, v + grad.square(), p)
    for name, a, b, scale in zip(("param", "exp_avg", "exp_avg_sq", "out"), results["triton"], results["torch"],
                                 scales):
        if a is None:
            continue
        assert not a.isnan().any(), f"{name} not fully written, {msg}"
        assert_close_out(a, b, scale, f"{name} {msg}")


@needs_triton
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("rdtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("accumulate", [False, True])
def test_epilogue_triton_matches_reference(monkeypatch, n: int, rdtype, accumulate: bool) -> None:
    seed, g = _gen()
    reduced = torch.randn(n, generator=g).to(rdtype)
    acc0 = torch.randn(n, generator=g) if accumulate else _poisoned(n, torch.float32)
    scale = torch.tensor([0.125 + torch.rand(1, generator=g).item()])
    results = {}
    for backend in ("torch", "triton"):
        monkeypatch.setenv("ZERO_CORE_KERNELS", backend)
        acc, sumsq, nf = acc0.clone(), torch.tensor([2.5]), torch.zeros(1, dtype=torch.int32)
        K.reduce_epilogue(reduced, acc, scale, accumulate, sumsq, nf)
        results[backend] = (acc, sumsq, nf)
    (a, s, f), (ra, rs, rf) = results["triton"], results["torch"]
    msg = f"n={n} reduced={rdtype} accumulate={accumulate} seed={seed}"
    assert not a.isnan().any(), f"acc not fully written, {msg}"
    torch.testing.assert_close(a, ra, rtol=1e-6, atol=1e-30, msg=msg)
    torch.testing.assert_close(s, rs, rtol=1e-5, atol=0, msg=msg)  # summation order differs
    torch.testing.assert_close(s - 2.5, ra.square().sum().reshape(1), rtol=1e-5, atol=1e-6, msg=msg)
    assert f.item() == rf.item() == 0, msg


# ---------------------------------------------------------------- flags, skip, determinism (both backends)

BACKENDS = ["torch", "auto", pytest.param("triton", marks=needs_triton)]  # auto on CPU: torch's fused CPU Adam


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan"), None])
@pytest.mark.parametrize("rdtype", [torch.float32, torch.float16])
def test_epilogue_nonfinite_flag(monkeypatch, backend: str, bad, rdtype) -> None:
    monkeypatch.setenv("ZERO_CORE_KERNELS", backend)
    n = FEW_BLOCKS
    reduced = torch.randn(n).to(rdtype)
    if bad is not None:
        reduced[n - 3] = bad  # in the ragged last block
    nf = torch.zeros(1, dtype=torch.int32)
    K.reduce_epilogue(reduced, torch.zeros(n), torch.tensor([1.0]), True, torch.zeros(1), nf)
    assert nf.item() == (0 if bad is None else 1)
    # never reset: a later finite bucket leaves the flag set
    nf.fill_(1)
    K.reduce_epilogue(torch.randn(n).to(rdtype), torch.zeros(n), torch.tensor([1.0]), False, torch.zeros(1), nf)
    assert nf.item() == 1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("out_dtype", [None, torch.bfloat16, torch.float32])
def test_adamw_skip_writes_nothing(monkeypatch, backend: str, out_dtype) -> None:
    monkeypatch.setenv("ZERO_CORE_KERNELS", backend)
    n = 4097
    # a known pattern, including a NaN payload, that any write would disturb
    pattern = torch.arange(n, dtype=torch.int32) * 7919
    bufs = [pattern.view(torch.float32).clone() for _ in range(3)]
    bufs[0][5] = float("nan")
    out = None if out_dtype is None else (pattern.to(torch.int16) if out_dtype != torch.float32
                                          else pattern).view(out_dtype).clone()
    before = [b.clone() for b in bufs] + ([] if out is None else [out.clone()])
    p, m, v = bufs
    K.adamw_step(p, torch.randn(n), m, v, out, **_scalars(step=3.0, skip=1), beta1=0.9, beta2=0.999,
                 eps=1e-8, weight_decay=0.01)
    after = bufs + ([] if out is None else [out])
    for x, y in zip(before, after):
        assert torch.equal(x.view(torch.uint8), y.view(torch.uint8))


@pytest.mark.parametrize("backend", BACKENDS)
def test_epilogue_sumsq_accumulates_and_is_deterministic(monkeypatch, backend: str) -> None:
    monkeypatch.setenv("ZERO_CORE_KERNELS", backend)
    n = FEW_BLOCKS
    reduced, acc0 = torch.randn(n).bfloat16(), torch.randn(n)
    sums = []
    for _ in range(2):
        acc, sumsq = acc0.clone(), torch.tensor([10.0])
        K.reduce_epilogue(reduced, acc, torch.tensor([0.5]), True, sumsq, torch.zeros(1, dtype=torch.int32))
        sums.append(sumsq)
    expected = 10.0 + (acc0 + reduced.float() * 0.5).double().square().sum()
    torch.testing.assert_close(sums[0].double(), expected.reshape(1), rtol=1e-5, atol=0)
    assert torch.equal(sums[0].view(torch.int32), sums[1].view(torch.int32))


# ---------------------------------------------------------------- dispatch


def test_backend_selection(monkeypatch) -> None:
    cpu = torch.zeros(1)
    monkeypatch.delenv("ZERO_CORE_KERNELS", raising=False)
    assert K.backend_for(cpu) == "cpu"  # auto on CPU: the fused host kernel
    monkeypatch.setenv("ZERO_CORE_KERNELS", "torch")
    assert K.backend_for(cpu) == "torch"
    monkeypatch.setenv("ZERO_CORE_KERNELS", "cuda-please")
    with pytest.raises(ValueError, match="ZERO_CORE_KERNELS"):
        K.adamw_step(cpu, cpu.clone(), cpu.clone(), cpu.clone(), None, **_scalars(), beta1=0.9,
                     beta2=0.999, eps=1e-8, weight_decay=0.0)
    if HAS_TRITON:
        monkeypatch.setenv("ZERO_CORE_KERNELS", "triton")
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        with pytest.raises(ValueError, match="TRITON_INTERPRET"):
            K.backend_for(cpu)


@needs_triton
def test_torch_backend_never_calls_triton(monkeypatch) -> None:
    def boom(*args, **kwargs):
        raise AssertionError("Triton called under ZERO_CORE_KERNELS=torch")

    monkeypatch.setattr(triton_adamw, "adamw_step", boom)
    monkeypatch.setattr(triton_epilogue, "reduce_epilogue", boom)
    monkeypatch.setenv("ZERO_CORE_KERNELS", "torch")
    p, grad, m, v = _adam_state(10, torch.Generator().manual_seed(0))
    K.adamw_step(p, grad, m, v, None, **_scalars(), beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0)
    K.reduce_epilogue(grad, m, torch.ones(1), True, torch.zeros(1), torch.zeros(1, dtype=torch.int32))


def test_bad_inputs_raise() -> None:
    p = torch.zeros(8)
    with pytest.raises(ValueError, match="grad"):
        K.adamw_step(p, torch.zeros(8, dtype=torch.float16), p.clone(), p.clone(), None, **_scalars(),
                     beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0)
    with pytest.raises(ValueError, match="nonfinite"):
        K.reduce_epilogue(p.clone(), p, torch.ones(1), True, torch.zeros(1), torch.zeros(1))
