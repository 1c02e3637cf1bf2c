"""`zbench run --simulate-ranks N`: one process runs each variant as rank 0 of N over torch's fake
process group, so that one GPU (or the CPU) shows the per-rank memory and the batch that fits of an
N-rank run. zero_core's flat collectives write the rank's own share there (zero_core/comm.py)."""

from __future__ import annotations

import contextlib
import json
import math
import pathlib

import pytest
import torch
import torch.distributed as dist

from helpers import TINY, one_line_error, printed, table, tiny_scenario, zbench
from parity_workers import ds_config, make_model, train_local
from zero_core import comm

pytestmark = pytest.mark.slow  # spawned ranks or whole runs: outside the fast tier (-m 'not slow')


@contextlib.contextmanager
def fake_world(rank: int = 0):
    """This process as `rank` of a fake world of 4 (torch's testing backend), torn down afterwards."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=4)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_flat_collectives_write_this_ranks_share(monkeypatch):
    def backend(*args, **kwargs):  # older torch releases leave the outputs of fake collectives unwritten
        raise AssertionError("a simulated rank must not call the fake backend's collectives")

    monkeypatch.setattr(comm, "_reduce_scatter", backend)
    monkeypatch.setattr(comm, "_all_gather", backend)
    # rank 1, not 0: torch's own fake collectives (some releases) copy the first chunk, whoever asks
    with fake_world(rank=1):
        assert comm.simulated() and comm.world_size() == 4
        full = torch.arange(12.0)
        out = torch.full((3,), -1.0)
        comm.reduce_scatter_sum(out, full)
        assert out.tolist() == [3.0, 4.0, 5.0]  # rank 1's slice of its own sum
        gathered = torch.full((12,), -1.0)
        comm.all_gather_flat(gathered, torch.tensor([7.0, 8.0, 9.0]))
        # a fresh buffer (stage 3): written whole, this rank's slot its shard and the others zeros
        assert gathered.tolist() == [0.0] * 3 + [7.0, 8.0, 9.0] + [0.0] * 6
        comm.all_gather_flat_async(gathered, torch.tensor([1.0, 2.0, 3.0])).wait()
        assert gathered.tolist() == [0.0] * 3 + [1.0, 2.0, 3.0] + [0.0] * 6
        in_place = torch.arange(12.0)  # stages 1-2: the shard is this rank's slot; the others keep their values
        comm.all_gather_flat(in_place, in_place[3:6])
        assert in_place.tolist() == list(range(12))
        assert comm.all_gather_object({"a": 1}) == [{"a": 1}] * 4


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_the_engine_holds_one_quarter_of_the_states_and_trains(stage):
    import zero_core

    whole = zero_core.initialize(make_model(), ds_config(stage, "fp32", 2))  # no process group: world 1
    alone = whole.memory_bytes()
    whole.close()
    with fake_world():
        sim = zero_core.initialize(make_model(), ds_config(stage, "fp32", 2))
        losses = train_local(sim, 0, 4, 2, 4)
        held = sim.memory_bytes()
        shard = sim.layout.groups[-1].shard_numel
        sim.close()
    assert all(torch.isfinite(torch.tensor(losses)))
    if stage < 3:  # stage 3 reads the other ranks' shards as zeros: finite, but no model to train
        assert losses[-1] < losses[0]
    # rank 0 of 4 keeps a quarter of the fp32 master and Adam moments (up to the padding to 4 equal shards)
    assert held["optimizer_states"] * 4 == pytest.approx(alone["optimizer_states"], rel=0.05)
    assert held["optimizer_states"] < alone["optimizer_states"] / 3 and shard > 0


def _scenario(tmp_path: pathlib.Path) -> str:
    return tiny_scenario(
        tmp_path,
        "sim",
        [
            {"name": "ddp", "engine": "ddp"},
            {"name": "zero2", "engine": "zero", "stage": 2},
            {"name": "zero3", "engine": "zero", "stage": 3},
            {"name": "fsdp2", "engine": "fsdp2"},
            {"name": "ds-zero2", "engine": "deepspeed", "stage": 2},
        ],
        samples=64,
    )


def test_run_simulates_every_variant_in_one_process(tmp_path):
    out = tmp_path / "runs"
    proc = zbench("run", _scenario(tmp_path), "--simulate-ranks", "4", "--out", str(out), "--wandb", "off")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = table(proc.stdout)
    assert "rank 0 of 4 simulated on one cpu" in printed(proc.stdout)
    assert "losses and metrics are not a training result" in printed(proc.stdout + proc.stderr)
    for name in ("ddp", "zero2", "zero3", "fsdp2"):
        assert rows[name]["Loss parity vs DDP"] == "simulated ranks: not compared", rows[name]
    assert "DeepSpeed's communication needs real peers" in rows["ds-zero2"]["Notes"]  # not installed here either
    run = next(out.glob("*/"))
    vocab = json.loads(pathlib.Path(TINY).read_text())["config"]["vocab_size"]
    summary = json.loads((run / "results.json").read_text())
    assert summary["simulated"] and summary["world_size"] == 4
    for r in summary["variants"]:
        if r["status"] == "ok":
            assert r["world_size"] == 4 and r["simulated"]
            assert r["losses"][0] == pytest.approx(math.log(vocab), rel=0.05)  # rank 0's loss, not a quarter of it
            # tokens/s counts all 4 ranks' rows: 3 steps x 4 rows x 4 ranks x 16 positions per epoch
            assert r["tokens_per_s"] * r["train_s_per_epoch"] == pytest.approx(3 * 4 * 4 * 16, rel=1e-6)
    ranks = [p.name for p in run.glob("logs/zero2/*/attempt_0/*")]
    assert ranks == ["0"], ranks  # one process stood for the 4 ranks


@pytest.mark.parametrize(
    "args, message",
    [
        (("--simulate-ranks", "4", "--gpus", "2"), "drop --gpus and --nnodes"),
        (("--simulate-ranks", "1"), "1 is not in the range"),
    ],
)
def test_simulation_flags_that_cannot_apply_are_one_line_errors(tmp_path, args, message):
    proc = zbench("run", _scenario(tmp_path), *args, "--out", str(tmp_path / "runs"), "--wandb", "off")
    line = one_line_error(proc)
    assert message in line, line


def test_a_simulated_run_writes_no_checkpoint_and_says_so(tmp_path):
    out = tmp_path / "runs"
    path = tiny_scenario(tmp_path, "simckpt", [{"name": "zero2", "engine": "zero", "stage": 2}], checkpoint_every=1)
    proc = zbench("run", path, "--simulate-ranks", "2", "--out", str(out), "--wandb", "off")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "no checkpoints are written" in proc.stderr
    run = next(out.glob("*/"))
    assert (run / "results.json").is_file() and not (run / "checkpoints").exists()  # rank 0 alone saved nothing
