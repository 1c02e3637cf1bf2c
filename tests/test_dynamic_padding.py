"""Dynamic padding: batches cut to their longest row (what Hugging Face's examples do without
--pad_to_max_length, as in the DeBERTa/MRPC seed article), synthetic rows of varying length, and the
tokens/s that counts the positions actually run."""

from __future__ import annotations

import json
import os

import pytest
import torch

from helpers import TINY, run_dir, table, write_scenario, zbench
from zbench.data.batches import trim_padding
from zbench.data.synthetic import synthetic_split
from zbench.scenario import ScenarioError, parse_scenario

pytestmark = pytest.mark.slow  # spawned ranks or whole runs: outside the fast tier (-m 'not slow')


def test_trim_cuts_every_row_wide_tensor_to_the_longest_row():
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0]])
    b = {
        "input_ids": torch.arange(12).view(2, 6) * mask,
        "attention_mask": mask,
        "labels": torch.tensor([0, 1]),
        "token_labels": torch.full((2, 6), 7),
    }
    out = trim_padding(b)
    assert out["input_ids"].tolist() == [[0, 1, 2, 0], [6, 7, 8, 9]]
    assert out["attention_mask"].shape == (2, 4) and out["token_labels"].shape == (2, 4)
    assert torch.equal(out["labels"], b["labels"])  # per-row labels keep their shape
    full = {"input_ids": torch.ones(2, 3, dtype=torch.long), "attention_mask": torch.ones(2, 3, dtype=torch.long)}
    assert trim_padding(full) is full
    assert trim_padding({"input_ids": torch.ones(2, 3)})["input_ids"].shape == (2, 3)  # no mask: nothing to cut


def test_synthetic_lengths_follow_the_spec_and_keep_the_fixed_length_rows():
    spec = {"mean": 20.0, "std": 6.0, "min": 8}
    fixed = synthetic_split("classification", 4000, 48, 100, 3)
    varied = synthetic_split("classification", 4000, 48, 100, 3, lengths=spec)
    lengths = varied["attention_mask"].sum(dim=1)
    assert lengths.min() >= 8 and lengths.max() <= 48
    assert abs(lengths.float().mean().item() - 20.0) < 0.5 and abs(lengths.float().std().item() - 6.0) < 0.5
    keep = varied["attention_mask"].bool()
    assert torch.equal(varied["input_ids"][keep], fixed["input_ids"][keep])  # same tokens where the row goes on
    assert (varied["input_ids"][~keep] == 0).all() and torch.equal(varied["labels"], fixed["labels"])
    assert (varied["attention_mask"][:, :8] == 1).all()  # right padding: every row starts with its tokens
    tokens = synthetic_split("token_classification", 64, 48, 100, 3, lengths=spec)
    assert (tokens["labels"][tokens["attention_mask"] == 0] == -100).all()  # padding is left out of the loss


def _scenario(**extra) -> dict:
    return {
        "model": {"arch": TINY, "num_labels": 2},
        "task": "classification",
        "seq_len": 48,
        "steps": 2,
        "batch_size": 4,
        "gpus": 1,
        "data": {"synthetic": {"train_samples": 64, "eval_samples": 16}},
        "variants": [{"name": "ddp", "engine": "ddp"}],
        **extra,
    }


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"task": "lm", "dynamic_padding": True}, "dynamic_padding applies to classification and token_classification"),
        ({"dynamic_padding": True, "measure_floor": True}, "measure_floor times one fixed batch shape"),
        ({"data": {"synthetic": {"lengths": {"mean": 20, "std": 5, "min": 64}}}}, "lengths.min 64 exceeds seq_len 48"),
        (
            {"task": "lm", "data": {"synthetic": {"lengths": {"mean": 20, "std": 5}}}},
            "lengths applies to classification",
        ),
    ],
)
def test_padding_settings_that_cannot_apply_are_one_line_errors(extra, message):
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(_scenario(**extra))


def test_dynamic_padding_trains_the_same_and_counts_fewer_tokens(tmp_path):
    """Padding is masked out, so cutting it changes no loss (tiny GPT: causal attention, the head reads the
    last real token); tokens/s counts the positions run (whole epochs, and the steady steps alone), and the
    engines still agree."""
    runs = {}
    for name, extra in {
        "fixed": {},
        "dynamic": {"dynamic_padding": True},
        "dynamic_steady": {"dynamic_padding": True, "timing_skip_steps": 2},
    }.items():
        data = _scenario(
            gpus=2,
            steps=4,
            lr=3e-3,
            **extra,
            data={"synthetic": {"train_samples": 64, "eval_samples": 16, "lengths": {"mean": 16, "std": 4, "min": 8}}},
            variants=[{"name": "ddp", "engine": "ddp"}, {"name": "zero2", "engine": "zero", "stage": 2}],
        )
        proc = zbench(
            "run", write_scenario(tmp_path, data, name), "--out", str(tmp_path / f"runs_{name}"), "--wandb", "off"
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert table(proc.stdout)["zero2"]["Loss parity vs DDP"].endswith(" ok")
        runs[name] = {
            r["variant"]: r for r in json.load(open(os.path.join(run_dir(proc.stdout), "results.json")))["variants"]
        }
    fixed, dynamic, steady = runs["fixed"], runs["dynamic"], runs["dynamic_steady"]
    for name in ("ddp", "zero2"):
        assert dynamic[name]["losses"] == pytest.approx(fixed[name]["losses"], abs=1e-5)
        # fp32 GEMMs of other widths round differently (blocking differs by CPU); 4 Adam steps at lr 3e-3 carry
        # that into the weights: 2.1e-5 seen on one machine, far below what padding left in the loss would do
        assert dynamic[name]["eval"]["loss"] == pytest.approx(fixed[name]["eval"]["loss"], abs=1e-4)
        assert steady[name]["losses"] == dynamic[name]["losses"]
    assert "row lengths ~N(16, 4) in [8, 48]" in dynamic["ddp"]["data"]
    # fixed: 4 steps x 4 rows x 2 ranks x 48 positions; dynamic: each rank's batch cut to its longest row
    rows = 4 * 4 * 2
    assert fixed["ddp"]["tokens_per_s"] * fixed["ddp"]["train_s_per_epoch"] == pytest.approx(rows * 48, rel=1e-6)
    counted = dynamic["ddp"]["tokens_per_s"] * dynamic["ddp"]["train_s_per_epoch"]
    assert rows * 8 <= counted < rows * 48 * 0.75
    # TFLOP/s counts attention at the mean width run (12 L d T per token), not at seq_len
    arch = json.load(open(TINY))["config"]
    per_token = {
        k: r["ddp"]["tflops_per_gpu"] * 2 * 1e12 / r["ddp"]["tokens_per_s"]
        for k, r in (("fixed", fixed), ("dynamic", dynamic))
    }
    assert per_token["fixed"] - per_token["dynamic"] == pytest.approx(
        12 * arch["n_layer"] * arch["n_embd"] * (48 - counted / rows), rel=1e-6
    )
    counted_steady = steady["ddp"]["tokens_per_s"] * steady["ddp"]["step_ms"] / 1e3 * 2  # the last 2 of 4 steps
    assert rows // 2 * 8 <= counted_steady < rows // 2 * 48 * 0.75


def test_the_batch_search_tries_the_widest_batch_of_the_run():
    from zbench.data.batches import train_stream, widest_batch

    split = synthetic_split("classification", 200, 48, 100, 5, lengths={"mean": 16.0, "std": 6.0, "min": 8})
    for rank in (0, 1):
        seen = [next(s) for s in [train_stream(split, batch=4, rank=rank, world=2, seed=1)] for _ in range(30)]
        widths = [int(b["attention_mask"].sum(dim=1).max()) for b in seen]
        wide = widest_batch(split, batch=4, rank=rank, world=2, seed=1, micro_steps=30)
        assert int(wide["attention_mask"].sum(dim=1).max()) == max(widths) > widths[0]
        assert any(
            torch.equal(wide["input_ids"], b["input_ids"]) for b in seen
        )  # a batch of the run, not a made-up one
