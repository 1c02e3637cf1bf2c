"""The host update during backward (zero_core/optim/speculative.py): bitwise the plain step's, whether the step
keeps, redoes or undoes it; and never more host memory for its copies than the host has left (sized at the first
speculating pass, lowered with one line when MemAvailable is short)."""

from __future__ import annotations

import threading

import pytest
import torch
from parity_workers import ds_config, make_batches, make_model
from safetensors.torch import load_file

import zero_core
from zero_core.optim import HostAdamW, Hyper, speculative
from zero_core.optim.speculative import BACKUP_BYTES_PER_ELEMENT, HOST_MARGIN_BYTES, elements_that_fit
from zero_core.optim.states import TensorStates

ROW = BACKUP_BYTES_PER_ELEMENT


@pytest.mark.parametrize(
    "wanted, available, ranks, expect",
    [
        (5000, None, 1, 5000),  # nothing to read: as asked
        (5000, HOST_MARGIN_BYTES + ROW * 10**6, 1, 5000),  # plenty
        (10**6, HOST_MARGIN_BYTES + ROW * 5000, 1, 4096),  # what fits, in whole alignment units
        (10**6, 2 * (HOST_MARGIN_BYTES + ROW * 3000), 2, 2048),  # the node's ranks share what is left
        (10**6, HOST_MARGIN_BYTES // 2, 1, 0),  # less than the margin: nothing
    ],
)
def test_elements_that_fit(wanted, available, ranks, expect):
    assert elements_that_fit(wanted, available, ranks) == expect


def _train(fraction: float, clip: float, poison: bool = False,
           scales: tuple[float, ...] = (1.0, 1.0, 1.0)) -> tuple[list[torch.Tensor], list, int]:
    """len(scales) steps of a 4,096-element host AdamW fed three shards per pass, step i's gradient times
    scales[i]; the states, the ranges speculated in each pass, and the skipped count (`poison`: an inf in the
    second step's gradient)."""
    numel, sizes = 4096, (1024, 2048, 1024)
    states = TensorStates(numel, torch.device("cpu"))
    states.master.copy_(torch.randn(numel, generator=torch.Generator().manual_seed(3)))
    opt = HostAdamW(states, comm_dtype=torch.float32, clip=clip, overlap_fraction=fraction,
                    groups=[Hyper(0.9, 0.95, 1e-8, 0.1)], decoupled=True, lr_at=lambda a: torch.full((1,), 1e-2),
                    shard_stats=False, comm_device=torch.device("cpu"))
    gen = torch.Generator().manual_seed(7)
    speculated = []
    for step, scale in enumerate(scales):
        grads = torch.randn(numel, generator=gen) * scale
        if poison and step == 1:
            grads[5] = float("inf")
        opt.begin_pass(torch.ones(1), accumulate=False, final=True)
        start = 0
        for n in sizes:
            opt.receive(grads[start : start + n], start)
            start += n
        opt._folder.wait()  # backward outlasts the shards' updates (queued ones at its end are left to the step)
        opt.end_pass()
        speculated.append([r[:2] for r in opt.speculative.ranges])
        opt.step(torch.empty(numel, dtype=torch.bfloat16))
    opt.close()
    return [states.master, states.exp_avg, states.exp_avg_sq], speculated, int(opt.skipped)


@pytest.mark.parametrize("fraction, speculated", [(0.6, [(0, 1024), (3072, 4096)]), (0.8, [(0, 1024), (1024, 3072)])])
@pytest.mark.parametrize("clip, poison", [(0.0, False), (1e-3, False), (0.0, True)])
def test_speculative_updates_run_during_backward_and_settle_exactly(clip, poison, fraction, speculated):
    """The host update of each final shard starts before the step; the step keeps it, or undoes and redoes it
    (clipping engaged), or undoes it (a non-finite gradient): the states equal the plain step's bitwise, whichever
    shards were speculated (the backup holds them back to back). Once a step clipped, the next ones wait for the
    step (their guess would fail again); a skipped step changes nothing of that."""
    plain, _, skipped = _train(0.0, clip, poison)
    overlapped, ranges, skipped_overlapped = _train(fraction, clip, poison)
    # the shards that fit in the fraction were updated before the step
    assert ranges == [speculated] + [[] if clip else speculated] * 2
    assert skipped == skipped_overlapped == int(poison)
    for a, b in zip(plain, overlapped):
        assert torch.equal(a, b)


@pytest.mark.parametrize("clip", [0.0, 1e-3])
@pytest.mark.parametrize("room, expect", [(1500, [(0, 1024)]), (0, [])])
def test_short_host_memory_lowers_the_overlap_and_stays_exact(monkeypatch, capsys, clip, room, expect):
    plain, _, _ = _train(0.0, clip)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setattr(speculative, "available_host_bytes", lambda: HOST_MARGIN_BYTES + ROW * room)
    lowered, ranges, _ = _train(0.8, clip)  # 0.8 of 4096 would speculate the first two shards (3,072 elements)
    assert ranges == [expect] + [[] if clip else expect] * 2  # clipped: later steps wait for the step
    for a, b in zip(plain, lowered):
        assert torch.equal(a, b)
    said = [line for line in capsys.readouterr().out.splitlines() if "overlap_host_update lowered" in line]
    assert said == [f"zero_core: overlap_host_update lowered to {len(expect) * 1024:,} of 3,276 elements: their "
                    "copies need 12 bytes each and the host has too little memory left"]


def test_enough_host_memory_keeps_the_overlap(monkeypatch, capsys):
    monkeypatch.setattr(speculative, "available_host_bytes", lambda: HOST_MARGIN_BYTES + ROW * 10**6)
    _, ranges, _ = _train(0.8, 0.0)
    assert ranges == [[(0, 1024), (1024, 3072)]] * 3
    assert "lowered" not in capsys.readouterr().out


def test_speculation_pauses_after_a_clipped_step_and_resumes_after_an_unclipped_one():
    """Norms of about 6,400, 64 and 64 against a threshold of 1,000: the first step speculates and clips, the
    second waits for the step (it would have kept the guess: unclipped), the third speculates again; all exact."""
    scales = (100.0, 1.0, 1.0)
    plain, _, _ = _train(0.0, 1000.0, scales=scales)
    overlapped, ranges, _ = _train(0.6, 1000.0, scales=scales)
    assert ranges == [[(0, 1024), (3072, 4096)], [], [(0, 1024), (3072, 4096)]]
    for a, b in zip(plain, overlapped):
        assert torch.equal(a, b)


def _twin_states(numel: int) -> tuple[TensorStates, TensorStates, torch.Tensor]:
    """Two equal host states (one for the plain step, one for the speculating) and one pass's gradient."""
    twins = [TensorStates(numel, torch.device("cpu")) for _ in range(2)]
    for st in twins:
        st.master.copy_(torch.randn(numel, generator=torch.Generator().manual_seed(3)))
    return twins[0], twins[1], torch.randn(numel, generator=torch.Generator().manual_seed(7))


def _optimizer(states: TensorStates, fraction: float, clip: float) -> HostAdamW:
    return HostAdamW(states, comm_dtype=torch.float32, clip=clip, overlap_fraction=fraction,
                     groups=[Hyper(0.9, 0.95, 1e-8, 0.1)], decoupled=True, lr_at=lambda a: torch.full((1,), 1e-2),
                     shard_stats=False, comm_device=torch.device("cpu"))


def _end_before_the_shards_land(opt: HostAdamW, grads: torch.Tensor) -> None:
    """Three shards received while the fold thread is held up; the training thread's end_pass comes before the
    thread reaches them (it is let go once backward is marked queued)."""
    gate = threading.Event()
    opt._folder.submit(None, gate.wait)
    opt.begin_pass(torch.ones(1), accumulate=False, final=True)
    for lo in (0, 1024, 3072):
        opt.receive(grads[lo : lo + (2048 if lo == 1024 else 1024)], lo)
    ending = threading.Thread(target=opt.end_pass)
    ending.start()
    while not opt.backward_end.queued:
        pass
    gate.set()
    ending.join()


def test_shards_still_queued_when_backward_ends_are_left_to_the_step():
    """The fold thread is busy while the three shards arrive; backward ends (end_pass) before it reaches them,
    so none is speculated (the step updates them, in partition order) and the result is the plain step's."""
    numel = 4096
    plain, states, grads = _twin_states(numel)
    ranges = []
    for st, fraction in ((plain, 0.0), (states, 1.0)):
        opt = _optimizer(st, fraction, 0.0)
        _end_before_the_shards_land(opt, grads)
        ranges.append(list(opt.speculative.ranges))
        opt.step(torch.empty(numel, dtype=torch.bfloat16))
        opt.close()
    assert ranges == [[], []]
    for name in ("master", "exp_avg", "exp_avg_sq"):
        assert torch.equal(getattr(plain, name), getattr(states, name))


@pytest.mark.parametrize("clip", [0.0, 1e-3])  # kept, or restored and redone with the coefficient
def test_a_shard_being_updated_when_backward_ends_stops_at_its_next_piece(monkeypatch, clip):
    """Backward ends while the fold thread is on the first 1,024-element piece of a 4,096-element shard: that
    piece stays speculated, the other three are left to the step, and the result is still the plain step's."""
    monkeypatch.setenv("ZERO_CORE_HOST_CHUNK_NUMEL", "1024")
    numel = 4096
    plain, states, grads = _twin_states(numel)
    ranges, pieces = [], []
    for st, fraction in ((plain, 0.0), (states, 1.0)):
        opt = _optimizer(st, fraction, clip)
        adam, ending = opt._speculative_adam, []

        def first_piece_then_backward_ends(lo, hi, opt=opt, adam=adam, ending=ending):
            pieces.append((lo, hi))
            adam(lo, hi)
            training = threading.Thread(target=opt.end_pass)  # the training thread's end_pass, during this job
            training.start()
            ending.append(training)
            while not opt.backward_end.queued:
                pass

        opt._speculative_adam = first_piece_then_backward_ends
        for _ in range(2):  # the second pass speculates only if the first step applied unclipped
            opt.begin_pass(torch.ones(1), accumulate=False, final=True)
            opt.receive(grads, 0)
            if opt._speculating:  # the job ends the pass itself, after its first piece
                while not ending:
                    pass
                ending.pop().join()
            else:
                opt.end_pass()
            ranges.append(list(opt.speculative.ranges))
            opt.step(torch.empty(numel, dtype=torch.bfloat16))
        opt.close()
    assert pieces == ([(0, 1024)] if clip else [(0, 1024), (0, 1024)])
    assert ranges == [[], [], [(0, 1024, 0)], [] if clip else [(0, 1024, 0)]]
    for name in ("master", "exp_avg", "exp_avg_sq"):
        assert torch.equal(getattr(plain, name), getattr(states, name))


def _between_backward_and_step(overlap: float, folder) -> tuple[dict, dict, dict, list]:
    """Two steps, then a backward whose host updates may be speculated; a checkpoint and the fp32 state read
    before that step, and the state after it."""
    cfg = ds_config(2, "fp32", 2, offload_optimizer={"device": "cpu"})
    cfg["zero_core"] = {"overlap_host_update": overlap}
    engine = zero_core.initialize(make_model(), cfg)
    batches = make_batches(3, 2)
    for x, y in batches[:2]:
        engine.backward(engine(x, y).loss)
        engine.step()
    x, y = batches[2]
    engine.backward(engine(x, y).loss)
    speculated = list(engine.optimizer.speculative.ranges)
    engine.save_16bit_model(folder / "weights", "model.safetensors")  # first: each must see the pre-step states
    engine.save_checkpoint(folder)
    before = {**engine.full_state_dict(), **{f"16bit.{k}": v for k, v in
                                             load_file(folder / "weights" / "model.safetensors").items()}}
    engine.step()
    after = engine.full_state_dict()
    engine.close()
    reloaded = zero_core.initialize(make_model(), cfg)
    reloaded.load_checkpoint(folder)
    loaded = reloaded.full_state_dict()
    reloaded.close()
    return before, after, loaded, speculated


def test_states_read_between_backward_and_step_are_the_pre_step_ones(tmp_path, backward_outlasts_host_folds):
    """A checkpoint, full_state_dict or save_16bit_model taken after a backward whose host updates were
    speculated holds the states before the step, as without speculation; the step then still gives the plain
    result."""
    plain = _between_backward_and_step(0.0, tmp_path / "plain")
    overlapped = _between_backward_and_step(1.0, tmp_path / "overlapped")
    assert plain[3] == [] and overlapped[3]  # the second run did update during that backward
    for a, b in zip(plain[:3], overlapped[:3]):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


class _DeviceStillRunning:
    """A CUDA event of the end of backward that the device has not reached yet (until `done` is set)."""

    def __init__(self, done: threading.Event) -> None:
        self.done = done

    def query(self) -> bool:
        return self.done.is_set()


def test_shards_landing_while_the_device_still_runs_backward_are_speculated(monkeypatch):
    """On CUDA the training thread queues backward far ahead of the device: end_pass comes before the shards'
    copies land. Backward has ended only once the device has run it, so those shards are still speculated
    (exactly: the result is the plain step's)."""
    numel = 4096
    plain, states, grads = _twin_states(numel)
    ranges = []
    for st, fraction in ((plain, 0.0), (states, 1.0)):
        opt = _optimizer(st, fraction, 0.0)
        device_done = threading.Event()

        def mark(end=opt.backward_end, device_done=device_done):  # what mark() records on CUDA
            end._done = _DeviceStillRunning(device_done)
            end.queued = True

        monkeypatch.setattr(opt.backward_end, "mark", mark)
        _end_before_the_shards_land(opt, grads)  # they land while the device is still on backward
        device_done.set()
        ranges.append(list(opt.speculative.ranges))
        opt.step(torch.empty(numel, dtype=torch.bfloat16))
        opt.close()
    assert ranges[0] == [] and [r[:2] for r in ranges[1]] == [(0, 1024), (1024, 3072), (3072, 4096)]
    for name in ("master", "exp_avg", "exp_avg_sq"):
        assert torch.equal(getattr(plain, name), getattr(states, name))
