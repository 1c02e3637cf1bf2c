"""Reliability battery, bad input: every command given something wrong answers with one `Error:` line that
names the problem, exits non-zero, prints no traceback, and leaves the disk as it was.

Every case runs inside a folder whose name has spaces and non-ASCII letters. Kinds covered: typos,
wrong types, contradictions, missing files, files of the wrong kind, empty or truncated files, output
over existing data, an unwritable folder; the engine API cases below add a checkpoint of another model.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import bad_input_cases
import zero_core
from checkpoints.source import CheckpointError
from fault_workers import tiny_checkpoint, unwritable
from helpers import FIXTURES, QUICKSTART, cli, one_line_error, quickstart, scenario_yaml, snapshot


@pytest.fixture(scope="module")
def good_checkpoint(tmp_path_factory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("good") / "ckpt")


def _scenario(**changes) -> str:
    return scenario_yaml(quickstart(**changes))


@pytest.fixture
def box(tmp_path: Path, good_checkpoint: Path) -> Path:
    """A folder of inputs, good and bad, that the cases point at (its own name has spaces and non-ASCII)."""
    tmp_path = tmp_path / "boîte à tests é"
    tmp_path.mkdir()
    (tmp_path / "empty.json").write_text("")
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "typo.json").write_text(
        json.dumps({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stgae": 2}})
    )
    (tmp_path / "bad type.json").write_text(json.dumps({"train_micro_batch_size_per_gpu": "two"}))
    (tmp_path / "truncated.json").write_text('{"train_micro_batch_size_per_gpu": 2, "zero_optimiz')
    (tmp_path / "dup.json").write_text('{"train_micro_batch_size_per_gpu": 2, "train_micro_batch_size_per_gpu": 4}')
    (tmp_path / "nvme.json").write_text(
        json.dumps(
            {
                "train_micro_batch_size_per_gpu": 2,
                "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}},
            }
        )
    )  # no nvme_path
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("not a checkpoint")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("precious")
    (tmp_path / "scenario typo.yaml").write_text(QUICKSTART.read_text().replace("seq_len:", "seq_lne:"))
    (tmp_path / "scenario empty.yaml").write_text("")
    (tmp_path / "scenario list.yaml").write_text("- 1\n- 2\n")
    (tmp_path / "not yaml.yaml").write_text("name: [unclosed\n")
    (tmp_path / "model.json").write_text("{}")
    (tmp_path / "dcp fake").mkdir()
    (tmp_path / "dcp fake" / ".metadata").write_bytes(b"\x80\x04garbage")
    (tmp_path / "ds fake" / "global_step1").mkdir(parents=True)
    (tmp_path / "ds fake" / "latest").write_text("global_step1")
    (tmp_path / "ds fake" / "global_step1" / "mp_rank_00_model_states.pt").write_bytes(b"PK\x03\x04 truncated")
    # DeepSpeed JSON: typos, wrong types and contradictions in zero_core's own section and elsewhere
    for name, cfg in {
        "zc typo.json": {"zero_core": {"comm_timeout": 5}},
        "zc type.json": {"zero_core": {"comm_timeout_s": "5 s"}},
        "zc negative.json": {"zero_core": {"max_consecutive_nonfinite": -1}},
        "both precisions.json": {"fp16": {"enabled": True}, "bf16": {"enabled": True}},
        "batch mismatch.json": {"train_batch_size": 10, "gradient_accumulation_steps": 2},
        "offload stage0.json": {"zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}},
    }.items():
        (tmp_path / name).write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, **cfg}))
    (tmp_path / "folder.json").mkdir()
    # scenarios: typos, wrong types, contradictions, missing or broken files they point at
    for name, text in {
        "variant typo.yaml": _scenario(variants=[{"name": "z", "engine": "zero", "stgae": 2}]),
        "wrong type.yaml": _scenario(seq_len="long"),
        "timeout zero.yaml": _scenario(comm_timeout_s=0),
        "both lengths.yaml": _scenario(steps=4),
        "no length.yaml": _scenario(epochs=None),
        "ddp stage.yaml": _scenario(variants=[{"name": "d", "engine": "ddp", "stage": 2}]),
        "twice.yaml": _scenario(variants=[{"name": "a", "engine": "ddp"}, {"name": "a", "engine": "ddp"}]),
        "missing arch.yaml": _scenario(model={"arch": "nowhere/modèle.json"}),
        "missing data.yaml": _scenario(data={"mrpc_tsv": "pas là"}),
        "missing ds.yaml": _scenario(variants=[{"name": "z", "engine": "zero", "ds_config": "absent.json"}]),
        "ds typo.yaml": _scenario(variants=[{"name": "z", "engine": "zero", "ds_config": "typo.json"}]),
        "truncated.yaml": _scenario()[:40],
    }.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    (tmp_path / "locked").mkdir()  # made unwritable while a case that writes there runs
    (tmp_path / "empty run").mkdir()
    (tmp_path / "empty run" / "results.json").write_text("")
    (tmp_path / "empty ckpt").mkdir()
    for name in ("ckpt", "ckpt no rank", "ckpt truncated", "ckpt empty manifest"):
        shutil.copytree(good_checkpoint, tmp_path / name)
    (tmp_path / "ckpt no rank" / "global_step1" / "rank_00000.safetensors").unlink()
    victim = tmp_path / "ckpt truncated" / "global_step1" / "rank_00000.safetensors"
    victim.write_bytes(victim.read_bytes()[:-64])
    (tmp_path / "ckpt empty manifest" / "global_step1" / "manifest.json").write_text("")
    (tmp_path / "a file").write_text("not a folder")
    bad_input_cases.write_inputs(tmp_path, _scenario)
    return tmp_path


DS = str(FIXTURES / "deepspeed" / "2_2_fp32")
CASES = [
    # zbench train
    (["train", "--config", "{b}/missing.json"], "cannot read"),
    (["train", "--config", "{b}/empty.json"], "not valid JSON"),
    (["train", "--config", "{b}/truncated.json"], "not valid JSON"),
    (["train", "--config", "{b}/list.json"], "config must be an object"),
    (["train", "--config", "{b}/typo.json"], "did you mean 'stage'"),
    (["train", "--config", "{b}/bad type.json"], "train_micro_batch_size_per_gpu"),
    (["train", "--config", "{b}/dup.json"], "train_micro_batch_size_per_gpu"),
    (["train", "--config", "{b}/nvme.json"], "nvme"),
    (["train", "--seq-len", "100000"], "block size"),
    (["train", "--gpus", "0"], "'--gpus': 0 is not in the range 1<=x<=1024"),
    (["train", "--stage", "4"], "'--stage': 4 is not in the range 0<=x<=3"),
    (["train", "--precision", "fp8"], "'fp8' is not one of 'fp32', 'bf16', 'fp16'"),
    (["bench", "kernels", "--numel", "lots"], "--numel"),
    (["bench", "kernels", "--numel", "-5"], "--numel"),
    # zbench convert / inspect
    (
        ["convert", "{b}/missing", "--to", "fp32", "--out", "{b}/out"],
        "missing does not exist; pass a checkpoint folder",
    ),
    (["convert", "{b}/notes", "--to", "fp32", "--out", "{b}/out"], "not a checkpoint"),
    (["convert", DS, "--to", "fp32", "--out", "{b}/full"], "already holds files"),
    (["convert", DS, "--to", "fp32", "--out", "{b}/out", "--tag", "global_step99"], "global_step99"),
    (["convert", DS, "--to", "fp64", "--out", "{b}/out"], "'fp64' is not one of 'fp32', 'bf16', 'fp16', 'zbench'"),
    (
        ["convert", DS, "--to", "fp32", "--out", "{b}/out", "--max-shard-size", "huge"],
        "size 'huge' is not understood; write e.g. 5GB",
    ),
    (
        ["convert", DS, "--to", "fp32", "--out", "{b}/out", "--from", "dcp"],
        "is a deepspeed checkpoint, not dcp; drop --from",
    ),
    (
        ["convert", DS, "--to", "zbench", "--world-size", "2", "--out", "{b}/out"],
        "--to zbench reshards zbench checkpoints only",
    ),
    (
        ["convert", "{b}/dcp fake", "--to", "fp32", "--out", "{b}/out"],
        ".metadata is truncated, corrupt or not DCP metadata",
    ),
    (["convert", "{b}/ds fake", "--to", "fp32", "--out", "{b}/out"], "no *_optim_states.pt files"),
    (["inspect", "{b}/missing"], "missing does not exist; pass a checkpoint folder"),
    (["inspect", "{b}/notes"], "not a checkpoint"),
    (["inspect", "{b}/ds fake"], "no *_optim_states.pt files"),
    # zbench run / report / estimate
    (["run", "{b}/missing.yaml"], "cannot read scenario"),
    (["run", "{b}/scenario typo.yaml", "--out", "{b}/runs"], "seq_lne"),
    (["run", "{b}/scenario empty.yaml", "--out", "{b}/runs"], "is empty; write the scenario's keys"),
    (["run", "{b}/scenario list.yaml", "--out", "{b}/runs"], "must be a YAML mapping, got a list"),
    (["run", "{b}/not yaml.yaml", "--out", "{b}/runs"], "is not valid YAML at line 2"),
    (["run", str(QUICKSTART), "--variants", "nosuch", "--out", "{b}/runs"], "nosuch"),
    (["run", str(QUICKSTART), "--gpus", "4096", "--out", "{b}/runs"], "4096 is not in the range 1<=x<=1024"),
    (
        ["run", str(QUICKSTART), "--resume", "{b}/notes", "--out", "{b}/runs"],
        "has no scenario.yaml: it is not a zbench run folder",
    ),
    (
        ["report", "{b}/notes"],
        "notes is not a zbench run folder (no results.json); pass a folder written by zbench run",
    ),
    (["estimate", "--model", "{b}/missing.json", "--gpus", "2"], "no model config file"),
    (["estimate", "--model", "{b}/model.json", "--gpus", "2"], 'must be {"family": "gpt"|"hf", "config": {...}}'),
    # typos and wrong types on the command line, in zero_core's section, in scenarios and their files
    (["train", "--stgae", "2"], "--stgae"),
    (["train", "--steps", "many"], "--steps"),
    (["convert", "{b}/ckpt", "--to", "fp32", "--out", "{b}/out", "--max-shard", "1GB"], "--max-shard"),
    (["train", "--config", "{b}/zc typo.json"], "did you mean 'comm_timeout_s'"),
    (["train", "--config", "{b}/zc type.json"], "zero_core.comm_timeout_s"),
    (["train", "--config", "{b}/zc negative.json"], "zero_core.max_consecutive_nonfinite"),
    (["run", "{b}/variant typo.yaml", "--out", "{b}/runs"], "variants[0].stgae"),
    (["run", "{b}/wrong type.yaml", "--out", "{b}/runs"], "seq_len"),
    (["run", "{b}/timeout zero.yaml", "--out", "{b}/runs"], "comm_timeout_s"),
    (["run", "{b}/ds typo.yaml", "--out", "{b}/runs"], "did you mean 'stage'"),
    # contradictions
    (["train", "--config", "{b}/both precisions.json"], "enable only one"),
    (["train", "--config", "{b}/batch mismatch.json", "--gpus", "2"], "train_batch_size (10)"),
    (["train", "--config", "{b}/offload stage0.json"], "offload_optimizer needs stage 1, 2 or 3"),
    (["run", "{b}/both lengths.yaml", "--out", "{b}/runs"], "sets both 'epochs' and 'steps'"),
    (["run", "{b}/no length.yaml", "--out", "{b}/runs"], "sets neither 'epochs' nor 'steps'"),
    (["run", "{b}/ddp stage.yaml", "--out", "{b}/runs"], "'stage' applies to zero and deepspeed"),
    (["run", "{b}/twice.yaml", "--out", "{b}/runs"], "used twice"),
    (["convert", "{b}/ckpt", "--to", "fp32", "--world-size", "2", "--out", "{b}/out"], "--world-size applies"),
    (["convert", "{b}/ckpt", "--to", "zbench", "--out", "{b}/out"], "--world-size M"),
    # missing files, also those a scenario points at
    (["run", "{b}/missing arch.yaml", "--out", "{b}/runs"], "modèle.json"),
    (["run", "{b}/missing data.yaml", "--out", "{b}/runs"], "pas là"),
    (["run", "{b}/missing ds.yaml", "--out", "{b}/runs"], "absent.json"),
    (["convert", "{b}/ckpt no rank", "--to", "fp32", "--out", "{b}/out"], "rank_00000.safetensors is missing"),
    (["inspect", "{b}/ckpt no rank"], "rank_00000.safetensors is missing"),
    # files of the wrong kind
    (["train", "--config", "{b}/folder.json"], "folder.json"),
    (["train", "--config", "{b}/scenario typo.yaml"], "not valid JSON"),
    (["run", "{b}/typo.json", "--out", "{b}/runs"], "train_micro_batch_size_per_gpu"),
    (["inspect", "{b}/a file"], "is a file; pass the checkpoint folder that holds it"),
    (["convert", DS, "--to", "fp32", "--out", "{b}/out", "--from", "zbench"], "is a deepspeed checkpoint, not zbench"),
    (["report", "{b}/ckpt"], "results.json"),
    (["estimate", "--model", "{b}/typo.json", "--gpus", "2"], 'must be {"family": "gpt"|"hf"'),
    # empty or truncated files and folders
    (["inspect", "{b}/empty ckpt"], "not a checkpoint"),
    (["inspect", "{b}/ckpt empty manifest"], "manifest.json"),
    (["convert", "{b}/ckpt truncated", "--to", "fp32", "--out", "{b}/out"], "truncated"),
    (["convert", "{b}/ckpt empty manifest", "--to", "bf16", "--out", "{b}/out"], "manifest.json"),
    (["report", "{b}/empty run"], "is not a zbench run folder (results.json is not valid JSON"),
    (["run", "{b}/truncated.yaml", "--out", "{b}/runs"], "model is required; add it to the scenario"),
    # output over existing data
    (["convert", "{b}/ckpt", "--to", "zbench", "--world-size", "2", "--out", "{b}/full"], "already holds files"),
    (["convert", "{b}/ckpt", "--to", "fp16", "--out", "{b}/a file"], "is a file, not a folder"),
    (["convert", "{b}/ckpt", "--to", "fp32", "--out", "{b}/ckpt"], "already holds files"),
    (["run", str(QUICKSTART), "--out", "{b}/a file"], "a file"),
    # an unwritable folder
    (["convert", "{b}/ckpt", "--to", "fp32", "--out", "{b}/locked/out"], "writable --out"),
    (["convert", "{b}/ckpt", "--to", "zbench", "--world-size", "3", "--out", "{b}/locked/out"], "writable --out"),
    (["run", str(QUICKSTART), "--out", "{b}/locked", "--wandb", "off"], "writable --out"),
    # the scenario runner's inputs: model config values, numbers, YAML, names, folders that are not runs, flags
    *bad_input_cases.CASES,
]


@pytest.mark.parametrize("args,expected", CASES, ids=[" ".join(a)[:60] for a, _ in CASES])
def test_bad_input(box: Path, args: list[str], expected: str) -> None:
    argv = [a.replace("{b}", str(box)) for a in args]
    before = snapshot(box)
    if any("{b}/locked" in a for a in args):
        with unwritable(box / "locked"):
            result = cli(*argv)
    else:
        result = cli(*argv)
    line = one_line_error(result)
    assert expected in line, line
    assert line.partition("; ")[2].strip(), f"no '; <how to fix it>' part: {line}"
    assert snapshot(box) == before


def test_a_usage_error_is_one_line_alone(box: Path) -> None:
    """click's usage block and hint are not printed above it: the line names the problem and the fix."""
    from helpers import QUICKSTART

    line = one_line_error(cli("run", QUICKSTART, "--gpus", "-1", "--out", box / "runs"), alone=True)
    assert line == "Error: Invalid value for '--gpus': -1 is not in the range 1<=x<=1024; see 'zbench run --help'"


# -- the engine API: a checkpoint of another model is refused before anything is read ------------------
def _other_names():
    from zbench.models.gpt import GPT, GPTConfig

    return GPT(GPTConfig(vocab_size=37, block_size=16, n_layer=1, n_head=2, n_embd=20))  # a block fewer


def _other_shapes():
    from zbench.models.gpt import GPT, GPTConfig

    return GPT(GPTConfig(vocab_size=37, block_size=16, n_layer=2, n_head=2, n_embd=24))  # same names, wider


ENGINE_CASES = [(_other_names, "is from another model"), (_other_shapes, "in the checkpoint but")]


@pytest.mark.parametrize("make,expected", ENGINE_CASES, ids=["other names", "other shapes"])
def test_checkpoint_of_another_model(good_checkpoint, make, expected):
    from ckpt_workers import config

    engine = zero_core.initialize(make(), config(2, 1))
    state = engine.full_state_dict()
    with pytest.raises(CheckpointError) as e:
        engine.load_checkpoint(good_checkpoint)
    assert expected in str(e.value) and "load a checkpoint of this model" in str(e.value)
    assert "\n" not in str(e.value)
    after = engine.full_state_dict()
    assert all(after[k].equal(state[k]) for k in state) and engine.global_step == 0
