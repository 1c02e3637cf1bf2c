"""torch.compile of the model's blocks (scenario key `compile`, zbench/models/compiled.py): every
zero_core stage trains a compiled model as it trains the eager one, and `zbench run` applies it per
variant and says so in its own column."""

from __future__ import annotations

import json
import pathlib

import pytest
import torch

from dist_harness import run_ranks
from parity_workers import ds_config, make_batches, make_model, train_local
from helpers import one_line_error, table, tiny_scenario, zbench
from zbench.models.compiled import compile_blocks, graphs_compiled
from zbench.models.factory import ModelBundle

pytestmark = pytest.mark.slow  # spawned ranks or whole runs: outside the fast tier (-m 'not slow')


def _bundle(model) -> ModelBundle:
    return ModelBundle(model, lambda m, b: m(*b), 0, 0, len(model.blocks), 0, None, list(model.blocks))


def _train(rank: int, world: int, stage: int, backend: str | None) -> tuple[list[float], dict, int]:
    import zero_core

    torch._dynamo.reset()
    model = make_model()
    if backend:
        compile_blocks(_bundle(model), backend)
    engine = zero_core.initialize(model, ds_config(stage, "fp32", 2))
    losses = train_local(engine, rank, world, 2, 3)
    state = engine.full_state_dict()
    engine.close()
    return losses, state, graphs_compiled()


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_compiled_blocks_train_as_eager_at_every_stage(stage):
    eager = run_ranks(_train, 2, stage, None)
    compiled = run_ranks(_train, 2, stage, "aot_eager")
    assert compiled[2] > 0 and eager[2] == 0  # the blocks really went through dynamo
    assert compiled[0] == pytest.approx(eager[0], rel=0, abs=1e-5)
    for k, v in eager[1].items():
        torch.testing.assert_close(compiled[1][k], v, rtol=0, atol=1e-5)


def test_inductor_blocks_give_eager_losses_and_gradients():
    torch._dynamo.reset()
    x, y = make_batches(1, 4)[0]
    eager, compiled = make_model(), make_model()
    assert compile_blocks(_bundle(compiled), "inductor") == len(compiled.blocks)
    for model in (eager, compiled):
        model(x, y).loss.backward()
    assert graphs_compiled() > 0
    torch.testing.assert_close(compiled(x, y).loss, eager(x, y).loss, rtol=0, atol=1e-5)
    for (name, p), q in zip(eager.named_parameters(), compiled.parameters()):
        if p.grad is not None:
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_a_model_without_blocks_is_a_clear_error():
    from zero_core import ConfigError

    with pytest.raises(ConfigError, match="no repeated blocks"):
        compile_blocks(ModelBundle(torch.nn.Linear(2, 2), None, 0, 0, 0, 0, None, []), "inductor")


def _scenario(tmp_path: pathlib.Path, **extra) -> str:
    return tiny_scenario(
        tmp_path,
        "compiled",
        [
            {"name": "ddp", "engine": "ddp"},
            {"name": "zero2", "engine": "zero", "stage": 2},
            {"name": "zero2-eager", "engine": "zero", "stage": 2, "compile": False},
        ],
        **extra,
    )


def test_scenario_compiles_every_variant_unless_one_says_otherwise(tmp_path):
    out = tmp_path / "runs"
    proc = zbench("run", _scenario(tmp_path, compile="aot_eager"), "--out", str(out), "--wandb", "off")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = table(proc.stdout)
    assert {n: r["torch.compile"] for n, r in rows.items()} == {
        "ddp": "aot_eager",
        "zero2": "aot_eager",
        "zero2-eager": "no",
    }
    assert rows["zero2"]["Loss parity vs DDP"].endswith(" ok"), rows["zero2"]
    assert rows["zero2-eager"]["Loss parity vs DDP"].endswith(" ok"), rows["zero2-eager"]
    summary = json.loads(next(out.glob("*/results.json")).read_text())
    graphs = {r["variant"]: r["compiled_graphs"] for r in summary["variants"]}
    assert graphs["ddp"] > 0 and graphs["zero2"] > 0 and graphs["zero2-eager"] == 0
    # no timing_skip_steps: the caption says the compiled rows' step time includes compiling
    assert "compiled rows' tokens/s and step time include compiling" in " ".join(proc.stdout.split())


def test_an_eager_scenario_has_no_compile_column(tmp_path):
    path = tiny_scenario(tmp_path, "eager", [{"name": "ddp", "engine": "ddp"}])
    proc = zbench("run", path, "--out", str(tmp_path / "runs"), "--wandb", "off")
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = table(proc.stdout)["ddp"]  # table.md, every column
    assert "torch.compile" not in proc.stdout and "torch.compile" not in row and "Batch size (max)" in row
    assert "include compiling" not in " ".join(proc.stdout.split())


def test_an_unknown_backend_is_one_line_naming_the_choices(tmp_path):
    proc = zbench("run", _scenario(tmp_path, compile="tvm"), "--out", str(tmp_path / "runs"), "--wandb", "off")
    line = one_line_error(proc, alone=True)
    assert "compile" in line and "inductor" in line, line


def test_dropout_is_detected_in_modules_and_in_functional_rates():
    from zbench.models.factory import uses_dropout
    from zbench.models.gpt import GPT, GPTConfig

    shape = dict(vocab_size=11, block_size=8, n_layer=1, n_head=1, n_embd=8)
    assert not uses_dropout(GPT(GPTConfig(**shape)))
    assert uses_dropout(GPT(GPTConfig(**shape, dropout=0.1)))  # passed to attention as dropout_p
    assert uses_dropout(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.1)))
    assert not uses_dropout(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.0)))


def test_compiled_rows_with_dropout_are_not_compared_step_by_step_with_eager_ones():
    from zbench.parity import add_parity

    def row(name, engine, compiled, dropout, losses):
        return {
            "variant": name,
            "engine": engine,
            "status": "ok",
            "batch": 4,
            "compiled": compiled,
            "dropout": dropout,
            "losses": losses,
        }

    rows = [
        row("ddp", "ddp", None, True, [1.0, 0.9]),
        row("zero2", "zero", "inductor", True, [1.2, 0.5]),
        row("zero2-eager", "zero", None, True, [1.0, 0.9]),
    ]
    add_parity(rows, 1e-3)
    assert (rows[1]["parity"], rows[1]["parity_note"]) == (None, "dropout masks differ (compiled vs eager)")
    assert (rows[2]["parity"], rows[2]["parity_note"]) == (0.0, "ok")
    without = [row("ddp", "ddp", None, False, [1.0, 0.9]), row("zero2", "zero", "inductor", False, [1.2, 0.5])]
    add_parity(without, 1e-3)
    assert without[1]["parity"] == pytest.approx(0.4) and without[1]["parity_note"] == "FAIL"
