"""ZeroStrategy with schedulers Lightning's loop steps (per epoch, the default interval; every n steps; on a
monitored value), resumed from ModelCheckpoint's "last" folder; the config's "auto" batch keys."""

from __future__ import annotations

import pytest

pytest.importorskip("lightning")

import lightning_schedule_workers as lsw  # noqa: E402
from dist_harness import run_ranks  # noqa: E402

pytestmark = pytest.mark.slow  # spawned ranks running Lightning fits: outside the fast tier (-m 'not slow')

# Lightning 2.6.6's DeepSpeedStrategy with DeepSpeed 0.19.8 on CPU (ZeRO-2), the same module, data and scheduler:
# every 4th loss and the lr it was trained with, over 3 epochs
DEEPSPEED = {
    "epoch": ([8.877106, 2.82074, 1.739375, 0.116365, 0.748564, 4.118299],
              [0.05, 0.05, 0.025, 0.025, 0.0125, 0.0125]),
    "every_2_steps": ([8.877106, 2.860906, 1.81592, 0.14676, 0.94579, 4.086037],
                      [0.05, 0.0405, 0.032805, 0.02657205, 0.0215233605, 0.017433922005]),
    "plateau": ([8.877106, 2.82074, 1.739375, 0.008132, 0.479197, 2.477895],
                [0.05, 0.05, 0.05, 0.05, 0.025, 0.025]),
}
# the same, resumed after 2 epochs from ckpt_path="last": the third epoch
DEEPSPEED_RESUMED = ([0.748564, 4.118299], [0.0125, 0.0125])


@pytest.mark.parametrize("kind", sorted(DEEPSPEED))
def test_a_scheduler_the_loop_steps_trains_as_deepspeed_strategy(kind):
    got = run_ranks(lsw.fit_scheduled, 1, kind)
    losses, lrs = DEEPSPEED[kind]
    assert got.get("lrs") == pytest.approx(lrs, rel=1e-9), got
    assert got["losses"] == pytest.approx(losses, abs=1e-5)


def test_resuming_last_goes_on_at_the_saved_lr(tmp_path):
    got = run_ranks(lsw.resume_last, 1, str(tmp_path))
    losses, lrs = DEEPSPEED_RESUMED
    assert got["lrs"] == pytest.approx(lrs, rel=1e-9)  # not the optimizer's initial 0.05 again
    assert got["losses"] == pytest.approx(losses, abs=1e-5)


def test_auto_batch_keys_take_the_trainers_values():
    plain = run_ranks(lsw.fit_with_config, 1, None)
    auto = run_ranks(lsw.fit_with_config, 1, {"gradient_accumulation_steps": "auto",
                                              "train_micro_batch_size_per_gpu": "auto"})
    assert isinstance(plain, list) and auto == plain
