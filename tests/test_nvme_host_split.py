"""Optimizer states across GPU, host memory and NVMe (`zero_core.nvme_host_ratio` with NVMe offload, alone or
with `offload_optimizer.ratio` < 1): the host update over a host+NVMe store equals the host-memory one
bitwise; whole runs on 2 gloo ranks equal plain CPU offload bitwise (clipping engaged, a skipped fp16 step,
stage 3); checkpoints and sharded initialisation fill the three stores; the key is validated."""

from __future__ import annotations

import pytest
import torch
from dist_harness import run_ranks
from parity_workers import ds_config, make_batches, make_model, zero_train

import zero_core
from zero_core import ConfigError, load_config
from zero_core.optim import HostAdamW, Hyper, SplitAdamW
from zero_core.optim.nvme_states import NvmeStates
from zero_core.optim.split_states import SplitStates
from zero_core.optim.states import NAMES, TensorStates

SMALL = {"ZERO_CORE_HOST_CHUNK_NUMEL": "1024", "ZERO_CORE_NVME_CHUNK_NUMEL": "2048"}


def _host_run(states) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    numel = states.numel
    writer = states.writer()
    writer.write(torch.randn(numel, generator=torch.Generator().manual_seed(1)))
    writer.close()
    opt = HostAdamW(states, comm_dtype=torch.float32, clip=0.05, groups=[Hyper(0.9, 0.95, 1e-8, 0.1)],
                    decoupled=True, lr_at=lambda a: torch.full((1,), 1e-2), shard_stats=False,
                    comm_device=torch.device("cpu"))
    gen, outs = torch.Generator().manual_seed(2), []
    for _ in range(3):
        opt.begin_pass(torch.ones(1), accumulate=False, final=True)
        opt.receive(torch.randn(numel, generator=gen), 0)
        opt.end_pass()
        out = torch.empty(numel, dtype=torch.bfloat16)
        opt.step(out)
        outs.append(out)
    got = {n: torch.cat([v[n].clone() for _, _, v in states.stream((n,), write_back=False)]) for n in NAMES}
    opt.close()
    return outs, got


def test_host_update_over_host_and_nvme_equals_host_memory_bitwise(tmp_path, monkeypatch):
    monkeypatch.setenv("ZERO_CORE_HOST_CHUNK_NUMEL", "1024")
    numel = 9 * 1024 + 77
    ref_outs, ref = _host_run(TensorStates(numel, torch.device("cpu")))
    split = SplitStates(TensorStates(3000, torch.device("cpu")),
                        NvmeStates(numel - 3000, str(tmp_path), 0, chunk=2048, buffer_count=3, block_size=4096))
    outs, got = _host_run(split)
    assert int(ref["master"].ne(torch.randn(numel, generator=torch.Generator().manual_seed(1))).sum()) > numel // 2
    assert all(torch.equal(a, b) for a, b in zip(outs, ref_outs))
    for n in NAMES:
        assert torch.equal(got[n], ref[n]), n


def _nvme(path, ratio: float = 1.0) -> dict:
    return {"reduce_bucket_size": 300, "offload_optimizer": {"device": "nvme", "nvme_path": str(path), "ratio": ratio}}


CASES = [
    {"stage": 2, "dtype": "fp32", "micro": 2, "steps": 4, "clip": 0.05},
    {"stage": 3, "dtype": "fp16", "micro": 2, "steps": 4, "inject_inf_at": 2, "clip": 0.05},
]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=["stage2-clipped", "stage3-fp16-skip"])
def test_gpu_host_nvme_split_trains_as_cpu_offload_bitwise(tmp_path, case):
    plain = {**case, "zero": {"reduce_bucket_size": 300, "offload_optimizer": {"device": "cpu"}}, "env": SMALL}
    split = [{**case, "zero": _nvme(tmp_path, ratio), "env": SMALL, "zero_core": {"nvme_host_ratio": host}}
             for ratio, host in ((1.0, 0.5), (0.6, 0.3))]
    full, *others = run_ranks(zero_train, 2, [plain, *split])
    assert full["global_step"] > 0 and (full["skipped"] >= 1) == ("inject_inf_at" in case)
    for other in others:
        assert other["losses"] == full["losses"] and other["skipped"] == full["skipped"]
        for k, v in full["state"].items():
            assert torch.equal(other["state"][k], v), k
    assert not list(tmp_path.iterdir())  # the state files are unlinked once opened: nothing left behind


def _config(path, **extra) -> dict:
    cfg = ds_config(2, "fp32", 2, clip=0.05, **_nvme(path, 0.6))
    return {**cfg, "zero_core": {"nvme_host_ratio": 0.5}, **extra}


def _train(engine, steps: int, first: int = 0) -> None:
    for x, y in make_batches(first + steps, 2)[first:]:
        engine.backward(engine(x, y).loss)
        engine.step()


@pytest.mark.slow
def test_three_stores_hold_their_shares_and_checkpoints_cross_load(tmp_path, monkeypatch):
    monkeypatch.setenv("ZERO_CORE_NVME_CHUNK_NUMEL", "2048")
    (tmp_path / "nvme").mkdir()
    engine = zero_core.initialize(make_model(), _config(tmp_path / "nvme"))
    opt = engine.optimizer
    assert isinstance(opt, SplitAdamW)
    host, disk = opt.states.host_part.device_part, opt.states.host_part.host_part
    assert isinstance(host, TensorStates) and isinstance(disk, NvmeStates)
    offloaded = opt.states.numel - opt.split
    assert opt.split > 0 and host.numel == int(0.5 * offloaded) and disk.numel == offloaded - host.numel
    _train(engine, 2)
    engine.save_checkpoint(tmp_path / "ckpt")
    _train(engine, 2, first=2)
    expected = engine.full_state_dict()
    engine.close()
    loader = zero_core.initialize(make_model(), ds_config(2, "fp32", 2, clip=0.05, reduce_bucket_size=300,
                                                          offload_optimizer={"device": "cpu"}))
    loader.load_checkpoint(tmp_path / "ckpt")
    _train(loader, 2, first=2)
    got = loader.full_state_dict()
    loader.save_checkpoint(tmp_path / "ckpt2")
    loader.close()
    for k, v in expected.items():  # the device and host AdamW agree to rounding
        assert torch.allclose(got[k], v, rtol=1e-5, atol=1e-6), k
    back = zero_core.initialize(make_model(), _config(tmp_path / "nvme"))
    back.load_checkpoint(tmp_path / "ckpt2")
    assert all(torch.equal(back.full_state_dict()[k], v) for k, v in got.items())
    back.close()


@pytest.mark.slow
def test_sharded_initialisation_fills_all_three_stores(tmp_path, monkeypatch):
    monkeypatch.setenv("ZERO_CORE_NVME_CHUNK_NUMEL", "2048")
    cfg = {**_config(tmp_path), "zero_optimization": {**_config(tmp_path)["zero_optimization"], "stage": 3}}
    torch.manual_seed(0)
    eager = make_model().state_dict()
    torch.manual_seed(0)
    with zero_core.init_context(cfg):
        model = make_model()
    engine = zero_core.initialize(model, cfg)
    got = engine.full_state_dict()
    engine.close()
    assert got.keys() == eager.keys()
    for k, v in eager.items():
        assert torch.equal(got[k], v), k


@pytest.mark.parametrize("offload, value, expected", [
    ({"device": "nvme", "nvme_path": "/tmp"}, 0.4, None),
    ({"device": "cpu"}, 0.4, "nvme_host_ratio=0.4 splits NVMe optimizer offload"),
    (None, 0.2, "offload_optimizer.device is 'none'"),
    ({"device": "nvme", "nvme_path": "/tmp"}, 1.0, "zero_core.nvme_host_ratio must be"),
    ({"device": "nvme", "nvme_path": "/tmp"}, -0.1, "zero_core.nvme_host_ratio must be"),
])
def test_nvme_host_ratio_is_validated(offload, value, expected):
    zero = {"stage": 2, **({"offload_optimizer": offload} if offload else {})}
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": zero, "zero_core": {"nvme_host_ratio": value}}
    if expected is None:
        assert load_config(cfg, 1).zero_core.nvme_host_ratio == value
        return
    with pytest.raises(ConfigError) as e:
        load_config(cfg, 1)
    assert expected in str(e.value) and "\n" not in str(e.value)
