"""ZeroStrategy's checkpoints take the optimizer states from the engine: Lightning's `dump_checkpoint` does not ask
the optimizer handle for a copy of this rank's states (a host copy of the fp32 master and moments) that the
strategy's save_checkpoint would then drop."""

from __future__ import annotations

import pytest

pytest.importorskip("lightning")

import lightning_zero_workers as lzw  # noqa: E402
from dist_harness import run_ranks  # noqa: E402

pytestmark = pytest.mark.slow  # a spawned rank fitting one epoch


def _save_counting_state_dicts(rank: int, world: int, path: str) -> int:
    from zero_core.integrations.handles import EngineOptimizer
    from zero_core.integrations.lightning import ZeroStrategy

    calls = []
    state_dict = EngineOptimizer.state_dict

    def counted(self):
        calls.append(1)
        return state_dict(self)

    EngineOptimizer.state_dict = counted
    trainer = lzw.trainer(ZeroStrategy(stage=2))
    trainer.fit(lzw.module(sched=True), lzw.batches())
    trainer.save_checkpoint(path)
    return len(calls)


def test_a_checkpoint_save_copies_no_optimizer_states_for_lightning(tmp_path):
    assert run_ranks(_save_counting_state_dicts, 1, str(tmp_path / "zero.ckpt")) == 0
