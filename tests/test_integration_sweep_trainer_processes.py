"""ZeroTrainer under a 2-process launch on a machine without GPUs, `use_cpu` not given: transformers' arguments
count one process (each would train on the whole dataset, and "auto" batch sizes are filled for one), so the run
is refused before the engine is built, in one line naming `use_cpu=True` (transformers on DeepSpeed 0.19.8 trains
that way and then fails in a gather)."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import trainer_workers as tw  # noqa: E402
from dist_harness import run_ranks  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("ZB_TEST_DEVICE") == "cuda", reason="GPUs: Trainer counts them all")


def _train_without_use_cpu(rank: int, world: int, out: str) -> dict:
    from zero_core.integrations.transformers import TrainingArguments, ZeroTrainer

    args = TrainingArguments(output_dir=out, deepspeed={"zero_optimization": {"stage": 2}}, report_to=[],
                             per_device_train_batch_size=2, max_steps=1, save_strategy="no")
    trainer = ZeroTrainer(model=tw.tiny_model("gpt2"), args=args, train_dataset=tw.Samples("gpt2", 8, 1))
    try:
        trainer.train()
    except ValueError as e:
        return {"counted": args.world_size, "error": str(e), "engine": trainer.engine is not None}
    return {"counted": args.world_size, "error": None, "engine": True}


@pytest.mark.slow  # spawned ranks
def test_a_launch_trainer_does_not_split_is_refused_naming_use_cpu(tmp_path):
    got = run_ranks(_train_without_use_cpu, 2, str(tmp_path))
    assert got["counted"] == 1  # transformers' own count of the 2 launched processes
    assert got["error"] is not None and "\n" not in got["error"]
    assert "count 1 process(es) but 2 were launched" in got["error"]
    assert got["error"].endswith("pass TrainingArguments(use_cpu=True)")
    assert not got["engine"]  # refused before the engine is built
