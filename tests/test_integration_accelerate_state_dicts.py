"""The optimizer and scheduler `prepare` hands back save and load their states as on Accelerate with DeepSpeed
0.19.8 (2 CPU ranks, tests/fixtures/make_accelerate_state_dict_fixtures.py, loops in
tests/accelerate_state_dict_workers.py): `scheduler.state_dict()` is the scheduler's own (a LambdaLR's, DeepSpeed's
`{"last_batch_iteration": n}` for the config's), `optimizer.state_dict()` holds this rank's states, and a fresh
Accelerator that loads what was torch.save'd after 3 updates (weights, optimizer in DeepSpeed's list-of-ranks form,
scheduler) continues with the losses and lrs of the run that never stopped. The prepared optimizer is a torch
Optimizer, so a scheduler can be built on it after `prepare`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("accelerate")

import accelerate_state_dict_workers as workers  # noqa: E402
from dist_harness import run_ranks  # noqa: E402

RECORDED = json.loads((Path(__file__).parent / "fixtures" / "accelerate_state_dicts.json").read_text())

pytestmark = pytest.mark.slow  # two spawned runs of 2 ranks each


def _flat(rows: list) -> list[float]:
    return [x for row in rows for x in row]


@pytest.mark.parametrize("stage, kind", [(2, "torch"), (2, "config"), (3, "torch"), (3, "config")])
def test_saved_states_resume_the_run_in_a_fresh_accelerator(tmp_path, stage, kind):
    real = RECORDED[f"{stage}_{kind}"]
    first = run_ranks(workers.save_then_go_on, 2, False, stage, kind, str(tmp_path))
    assert _flat(first["rows"]) == pytest.approx(_flat(real["first"]["rows"]), rel=1e-6)
    assert first["scheduler_state"] == real["first"]["scheduler_state"]
    assert first["optimizer_state_keys"]  # this rank's states, not an empty dict
    resumed = run_ranks(workers.resume, 2, False, stage, kind, str(tmp_path))
    assert _flat(resumed["rows"]) == pytest.approx(_flat(real["resumed"]["rows"]), rel=1e-6)
    assert resumed["rows"] == first["rows"][workers.SAVED_AFTER:]
    if kind == "torch":  # a DeepSpeed schedule reports its pre-load lr until it steps (docs/integrations/accelerate.md)
        assert resumed["lr_after_load"] == pytest.approx(real["resumed"]["lr_after_load"], rel=1e-12)


@pytest.mark.parametrize("kind", ["torch", "config"])
def test_optimizer_states_loaded_alone_leave_the_schedule_where_it_was(tmp_path, kind):
    """As DeepSpeed's: the next update takes the lr the loaded groups held, then the fresh scheduler goes on from its
    own start."""
    real = RECORDED[f"2_{kind}"]["optimizer_alone"]
    run_ranks(workers.save_then_go_on, 2, False, 2, kind, str(tmp_path))
    alone = run_ranks(workers.resume, 2, False, 2, kind, str(tmp_path), False)
    assert _flat(alone["rows"]) == pytest.approx(_flat(real["rows"]), rel=1e-6)
    if kind == "torch":  # DeepSpeed's unstepped schedule reports its warmup start; the next update's lr is the loaded
        assert alone["lr_after_load"] == pytest.approx(real["lr_after_load"], rel=1e-12)


@pytest.mark.parametrize("stage", [2, 3])
def test_a_scheduler_built_on_the_prepared_optimizer_sets_the_lrs(stage):
    """The prepared optimizer is a torch Optimizer, as Accelerate's DeepSpeed wrapper is: transformers' linear warmup
    built on it after `prepare` is accepted and each update takes the lr it set."""
    real = RECORDED[f"{stage}_scheduler_after_prepare"]
    got = run_ranks(workers.scheduler_after_prepare, 2, False, stage)
    assert got["is_optimizer"] is True
    assert _flat(got["rows"]) == pytest.approx(_flat(real["rows"]), rel=1e-6)


def test_a_scheduler_on_the_prepared_optimizer_comes_back_from_its_own_prepare():
    """Accelerate's DeepSpeed path hands such a scheduler back as it is (stepped once per call), where zero_core's
    refused a prepare() without the model."""
    real = RECORDED["2_scheduler_prepared_alone"]
    got = run_ranks(workers.scheduler_after_prepare, 2, False, 2, True)
    assert got["same"] is True and real["same"] is True
    assert _flat(got["rows"]) == pytest.approx(_flat(real["rows"]), rel=1e-6)
