"""Partial optimizer offload (offload_optimizer.ratio < 1), host updates started during backward
(zero_core.overlap_host_update) and the host share's front streamed (zero_core.offload_stream_fraction) equal
plain full offload bitwise on 2 gloo ranks (clipping engaged, fp16-style skipped steps, gradient accumulation,
stages 1-3); checkpoints cross-load between ratios; the new keys are validated."""

from __future__ import annotations

import pytest
import torch
from dist_harness import run_ranks
from parity_workers import ds_config, make_batches, make_model, zero_train

import zero_core
from zero_core import ConfigError, load_config
from zero_core.optim import HostAdamW, SplitAdamW

pytestmark = pytest.mark.slow  # spawned ranks or whole runs: outside the fast tier (-m 'not slow')

SMALL = {"ZERO_CORE_HOST_CHUNK_NUMEL": "1024"}  # many host chunks per rank


def _off(ratio: float, **extra) -> dict:
    # buckets small enough that partial offload keeps the same layout as full offload
    return {"reduce_bucket_size": 300, "offload_optimizer": {"device": "cpu", "ratio": ratio}, **extra}


BASE = [
    {"stage": 2, "dtype": "fp32", "micro": 2, "steps": 4, "clip": 0.05},
    {"stage": 2, "dtype": "fp32", "micro": 1, "gas": 3, "steps": 3, "clip": 0.05},
    {"stage": 1, "dtype": "bf16", "micro": 1, "gas": 2, "steps": 3, "clip": 0.05},
    {"stage": 3, "dtype": "fp32", "micro": 1, "gas": 2, "steps": 3, "clip": 0.05},
    {"stage": 2, "dtype": "fp16", "micro": 2, "steps": 4, "inject_inf_at": 1},
    {"stage": 3, "dtype": "fp16", "micro": 2, "steps": 4, "inject_inf_at": 2, "clip": 0.05},
]
# (ratio, overlap fraction, host update on its own thread after step(), streamed fraction[, the streamed chunks'
# gradients held on the device]): plain full offload with the update inside step() first, then the paths that
# must equal it
RATIOS = ((1.0, 0.0, False, 0.0), (1.0, 0.0, True, 0.0), (0.5, 0.0, True, 0.0), (0.2, 0.0, False, 0.0),
          (1.0, 1.0, True, 0.0), (1.0, 0.4, False, 0.0), (0.5, 1.0, True, 0.0), (1.0, 0.0, True, 0.7),
          (1.0, 1.0, False, 0.5), (0.5, 0.5, True, 0.6), (1.0, 0.0, True, 0.7, True), (0.5, 0.5, True, 0.6, True))


@pytest.fixture(scope="module")
def results() -> list[dict]:
    cases = [{**c, "zero": _off(r), "env": SMALL,
              "zero_core": {"overlap_host_update": f, "overlap_weight_gather": t, "offload_stream_fraction": s,
                            "offload_stream_hold_grads": bool(hold)}}
             for c in BASE for r, f, t, s, *hold in RATIOS]
    return run_ranks(zero_train, 2, cases)


@pytest.mark.parametrize("index", range(len(BASE)))
def test_partial_offload_equals_full_offload_bitwise(results, index):
    full, *partial = results[index * len(RATIOS) : (index + 1) * len(RATIOS)]
    assert full["global_step"] > 0 and not torch.equal(full["state"]["ln_f.weight"], make_model().ln_f.weight)
    if "inject_inf_at" in BASE[index]:
        assert full["skipped"] >= 1
    for setting, other in zip(RATIOS[1:], partial):
        assert other["losses"] == full["losses"], setting
        assert other["skipped"] == full["skipped"] and other["scale"] == full["scale"], setting
        assert other["master_sums"] == pytest.approx(full["master_sums"], rel=1e-13), setting  # in other pieces
        for k, v in full["state"].items():
            assert torch.equal(other["state"][k], v), (setting, k)


def _train(engine, steps: int, first: int = 0) -> None:
    for x, y in make_batches(first + steps, 2)[first:]:
        engine.backward(engine(x.to(engine.device), y.to(engine.device)).loss)
        engine.step()


@pytest.mark.parametrize("save_ratio, load_offload", [(0.3, {"device": "cpu"}), (0.3, None),
                                                      (1.0, {"device": "cpu", "ratio": 0.4})])
def test_checkpoints_cross_load_between_ratios(tmp_path, save_ratio, load_offload):
    def config(offload):
        return ds_config(2, "fp32", 2, clip=0.05, reduce_bucket_size=300,
                         **({"offload_optimizer": offload} if offload else {}))

    saver = zero_core.initialize(make_model(), config({"device": "cpu", "ratio": save_ratio}))
    _train(saver, 2)
    saver.save_checkpoint(tmp_path)
    _train(saver, 2, first=2)
    expected = saver.full_state_dict()
    saver.close()
    loader = zero_core.initialize(make_model(), config(load_offload))
    loader.load_checkpoint(tmp_path)
    _train(loader, 2, first=2)
    got = loader.full_state_dict()
    loader.close()
    for k, v in expected.items():  # the device and host AdamW agree to rounding
        assert torch.allclose(got[k], v, rtol=1e-5, atol=1e-6), k


def test_split_keeps_the_first_buckets_on_the_device():
    engine = zero_core.initialize(make_model(), ds_config(2, "fp32", 2, reduce_bucket_size=300,
                                                          offload_optimizer={"device": "cpu", "ratio": 0.5}))
    opt = engine.optimizer
    assert isinstance(opt, SplitAdamW) and isinstance(opt.host_opt, HostAdamW)
    assert 0 < opt.split <= opt.states.numel // 2  # at most (1 - ratio) of the partition on the device
    first = engine.layout.slots[0]  # the forward's first parameter (the embedding) is in the device share
    assert engine.layout.groups[first.group].partition_offset < opt.split
    assert engine.memory_bytes()["optimizer_states"] == opt.split * 12
    engine.close()


@pytest.mark.parametrize("ratio, expected", [(0.5, None), (1, None), ("auto", None), (0, "must be a number > 0"),
                                             (1.5, "must be a number > 0"), (-0.1, "must be"), ("half", "must be"),
                                             (True, "must be")])
def test_ratio_is_validated(ratio, expected):
    cfg = {"train_micro_batch_size_per_gpu": 1,
           "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": ratio}}}
    if expected is None:
        assert load_config(cfg, 1).zero_optimization.offload_optimizer.ratio == ratio
        return
    with pytest.raises(ConfigError) as e:
        load_config(cfg, 1)
    assert "offload_optimizer.ratio" in str(e.value) and expected in str(e.value) and "\n" not in str(e.value)


def test_auto_ratio_with_nvme_is_refused():
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {
        "stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp", "ratio": "auto"}}}
    with pytest.raises(ConfigError, match="ratio='auto' moves states from host memory to the GPU"):
        load_config(cfg, 1)


def _assert_continues_as_full_offload(got: dict, full: dict) -> None:
    """Bitwise on the CPU, where both shares run the same host AdamW; on a GPU the device share runs the fused
    kernel, which agrees with the host's to rounding."""
    for k, v in full.items():
        if torch.cuda.is_available():  # the engine runs where CUDA is
            assert torch.allclose(got[k].cpu(), v.cpu(), rtol=1e-5, atol=1e-6), k
        else:
            assert torch.equal(got[k], v), k


class FakeProbe:
    def __init__(self, limit: int | None, peak: int) -> None:
        self.limit, self.peak = limit, peak

    def limit_bytes(self) -> int | None:
        return self.limit

    def peak_bytes(self) -> int:
        return self.peak


@pytest.mark.parametrize("room_elements, expect_split, stream", [(None, False, 0.0), (0, False, 0.0), (6000, True, 0.0),
                                                                (10**9, True, 0.0), (6000, True, 0.6)])
def test_auto_ratio_moves_what_fits_after_the_first_step_and_trains_the_same(monkeypatch, room_elements, expect_split,
                                                                            stream):
    from zero_core.optim.auto_ratio import DEVICE_BYTES_PER_ELEMENT, MARGIN

    monkeypatch.setenv("ZERO_CORE_HOST_CHUNK_NUMEL", SMALL["ZERO_CORE_HOST_CHUNK_NUMEL"])

    def run(ratio, probe=None):
        cfg = ds_config(2, "fp32", 2, clip=0.05, reduce_bucket_size=300,
                        offload_optimizer={"device": "cpu", "ratio": ratio})
        cfg["zero_core"] = {"offload_stream_fraction": stream if ratio == "auto" else 0.0}
        engine = zero_core.initialize(make_model(), cfg)
        if probe is not None:
            engine.optimizer.auto.probe = probe
        _train(engine, 4)
        assert engine.optimizer.param_groups is engine.client_optimizer.param_groups  # kept across the re-split
        host = getattr(engine.optimizer, "host_opt", engine.optimizer)
        assert (host.streamed is not None) == (stream > 0 and ratio == "auto")  # the re-split host share streams too
        out = engine.full_state_dict(), getattr(engine.optimizer, "split", 0), engine.optimizer.states.numel
        engine.close()
        return out

    peak = 10**6
    limit = None if room_elements is None else int((peak + room_elements * DEVICE_BYTES_PER_ELEMENT) / (1 - MARGIN)) + 1
    auto_state, split, numel = run("auto", FakeProbe(limit, peak))
    assert (split > 0) == expect_split and split < numel  # something always stays offloaded
    if room_elements:
        assert split <= room_elements
    full_state, _, _ = run(1.0)
    _assert_continues_as_full_offload(auto_state, full_state)  # the re-split run continues as full offload


@pytest.mark.parametrize("ratio, noted", [(0.999, True), (0.5, False), (1.0, False)])
def test_a_ratio_that_leaves_the_device_share_empty_says_so(capsys, ratio, noted):
    engine = zero_core.initialize(make_model(), ds_config(2, "fp32", 2, reduce_bucket_size=300,
                                                          offload_optimizer={"device": "cpu", "ratio": ratio}))
    split = getattr(engine.optimizer, "split", 0)
    engine.close()
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "keeps no optimizer states" in ln]
    assert (split == 0) == (ratio > 0.99) and len(lines) == int(noted)
    if noted:  # the largest ratio it names does keep the first bucket
        most = float(lines[0].split("a ratio of at most ")[1].split()[0])
        engine = zero_core.initialize(make_model(), ds_config(2, "fp32", 2, reduce_bucket_size=300,
                                                              offload_optimizer={"device": "cpu", "ratio": most}))
        assert engine.optimizer.split > 0
        engine.close()


def test_auto_ratio_gives_the_host_back_what_the_moved_states_held():
    """With host updates during backward, the first step's speculative copies are freed when the states move,
    the new host share lands its gradients in the old pinned staging's tail (nothing new is allocated
    beside a host the first step filled), the new share makes copies of its own, and the run equals full offload."""
    import weakref

    from zero_core.optim.auto_ratio import DEVICE_BYTES_PER_ELEMENT, MARGIN

    def run(ratio, probe=None):
        cfg = ds_config(2, "fp32", 2, reduce_bucket_size=300, offload_optimizer={"device": "cpu", "ratio": ratio})
        cfg["zero_core"] = {"overlap_host_update": 1.0}
        engine = zero_core.initialize(make_model(), cfg)
        first, seen = engine.optimizer, {}
        if probe is not None:
            first.auto.probe = probe
        for step, (x, y) in enumerate(make_batches(4, 2)):
            engine.backward(engine(x.to(engine.device), y.to(engine.device)).loss)
            if step == 0 and probe is not None:
                seen["backup"] = weakref.ref(first.host_opt.speculative._backup["master"])
                seen["staging"] = first.host_opt.staging.data_ptr()
            engine.step()
        out = engine.full_state_dict(), engine.optimizer, first, seen
        engine.close()
        return out

    peak = 10**6
    probe = FakeProbe(int((peak + 6000 * DEVICE_BYTES_PER_ELEMENT) / (1 - MARGIN)) + 1, peak)
    auto_state, opt, first, seen = run("auto", probe)
    assert isinstance(opt, SplitAdamW) and opt.split > 0 and opt is not first
    assert opt.host_opt.speculative._backup  # the new host share has copies of its own, made after the move
    assert seen["backup"]() is None and first.host_opt.speculative.budget == 0  # the old copies are gone
    itemsize = opt.host_opt.staging.element_size()
    assert opt.host_opt.staging.data_ptr() == seen["staging"] + opt.split * itemsize
    full_state, _, _, _ = run(1.0)
    _assert_continues_as_full_offload(auto_state, full_state)


@pytest.mark.parametrize("value, ok", [(0.0, True), (0.5, True), (1, True), (1.5, False), ("yes", False)])
def test_overlap_host_update_is_validated(value, ok):
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_core": {"overlap_host_update": value},
           "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    if ok:
        assert load_config(cfg, 1).zero_core.overlap_host_update == value
        return
    with pytest.raises(ConfigError, match="zero_core.overlap_host_update must be a number"):
        load_config(cfg, 1)


def test_breakdown_shows_gpu_adam_and_overlapped_cpu_adam():
    from zero_core.step_timer import format_breakdown

    cfg = ds_config(2, "fp32", 2, reduce_bucket_size=300, offload_optimizer={"device": "cpu", "ratio": 0.5})
    cfg["zero_core"] = {"overlap_host_update": 1.0, "overlap_weight_gather": True}
    engine = zero_core.initialize(make_model(), cfg)
    _train(engine, 3)
    b = engine.breakdown.summary()
    engine.close()
    # stages 1-2: the host update runs on its own thread after step() returns, the next forward waiting per module
    assert b["gpu_adam"] > 0 and b["overlapped_cpu_adam"] > 0 and b["cpu_adam"] == 0
    line = format_breakdown(b)
    assert "gpu adam" in line and "overlapped cpu adam" in line


@pytest.mark.parametrize("offload", [None, {"device": "none"}, {"device": "nvme", "nvme_path": "/tmp"}])
def test_overlap_host_update_without_host_states_is_refused(offload):
    """Nothing in host memory to update during backward: one line naming both keys, not a silent no-op."""
    zero = {"stage": 2, **({"offload_optimizer": offload} if offload else {})}
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_core": {"overlap_host_update": 0.5}, "zero_optimization": zero}
    with pytest.raises(ConfigError) as e:
        load_config(cfg, 1)
    msg = str(e.value)
    assert "zero_core.overlap_host_update=0.5" in msg and "set the device to 'cpu'" in msg and "\n" not in msg
    cfg["zero_core"]["overlap_host_update"] = 0.0  # off: nothing to contradict
    assert load_config(cfg, 1).zero_core.overlap_host_update == 0.0
