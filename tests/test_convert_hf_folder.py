"""`zbench convert --to fp32` writes folders `from_pretrained` opens: the Hugging Face files beside a Trainer-style
`checkpoint-N/` are copied (or `--hf-config` supplies config.json); tied weights are stored once and the sharded
index lists each name only with the shard that holds it, as save_pretrained writes them."""

from __future__ import annotations

import os
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

pytest.importorskip("transformers")

import trainer_workers as tw  # noqa: E402
from dist_harness import run_ranks  # noqa: E402
from helpers import cli, one_line_error  # noqa: E402

pytestmark = pytest.mark.slow  # spawned ranks or whole runs: outside the fast tier (-m 'not slow')


def _save(rank: int, world: int, folder: str) -> dict:
    """A world-of-one engine on a tiny GPT-2 (tied lm_head), one step, a zbench checkpoint in folder/checkpoint-1."""
    import zero_core

    model = tw.tiny_model("gpt2")
    model.config.save_pretrained(folder)  # the run folder holds the HF files, as Trainer's output_dir does
    (Path(folder) / "tokenizer_config.json").write_text("{}")
    engine = zero_core.initialize(model, {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}})
    ids = tw.Samples("gpt2", 2, 1).ids
    engine.backward(engine(input_ids=ids, labels=ids).loss)
    engine.step()
    engine.save_checkpoint(f"{folder}/checkpoint-1")
    return engine.full_state_dict()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    run = tmp_path_factory.mktemp("run")
    return run, run_ranks(_save, 1, str(run))


def _loaded(out) -> dict[str, torch.Tensor]:
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(str(out)).state_dict()


@pytest.mark.parametrize("shard", ["5GB", "20KB"])
def test_hf_layout_converts_to_a_loadable_folder(saved, tmp_path, shard):
    run, weights = saved
    result = cli("convert", run / "checkpoint-1", "--to", "fp32", "--out", tmp_path / "out", "--max-shard-size", shard)
    assert result.exit_code == 0, result.output
    out = tmp_path / "out"
    assert (out / "config.json").is_file() and (out / "tokenizer_config.json").is_file()
    loaded = _loaded(out)
    assert all(torch.equal(loaded[k], weights[k]) for k in weights)
    index = out / "model.safetensors.index.json"
    if shard == "20KB":
        weight_map = json.loads(index.read_text())["weight_map"]
        assert len(set(weight_map.values())) > 1
        for name, file in weight_map.items():  # never a name its shard lacks
            with safe_open(str(out / file), "pt") as f:
                assert name in f.keys()
        assert "lm_head.weight" not in weight_map and "transformer.wte.weight" in weight_map
    else:
        assert not index.exists()
        with safe_open(str(out / "model.safetensors"), "pt") as f:
            assert "lm_head.weight" not in f.keys()


def test_hf_config_supplies_the_config(saved, tmp_path):
    run, weights = saved
    bare = tmp_path / "bare"
    bare.mkdir()
    (run / "checkpoint-1").rename(bare / "checkpoint-1")
    try:
        bad = tmp_path / "bad.json"
        bad.write_text("[1]")
        fifo = tmp_path / "fifo.json"
        os.mkfifo(fifo)
        huge = tmp_path / "huge.json"
        with open(huge, "wb") as f:
            f.truncate(17 << 20)
        for config, words in ((bad, "not a JSON object"), (fifo, "not a regular file"), ("/dev/zero", "regular"),
                              (huge, "larger than 16 MiB")):  # never read without end, nor waited on
            line = one_line_error(cli("convert", bare / "checkpoint-1", "--to", "fp32", "--out", tmp_path / "o1",
                                      "--hf-config", config))
            assert "--hf-config" in line and words in line and not (tmp_path / "o1").exists(), line
        result = cli("convert", bare / "checkpoint-1", "--to", "fp32", "--out", tmp_path / "o2",
                     "--hf-config", run / "config.json")
        assert result.exit_code == 0, result.output
        loaded = _loaded(tmp_path / "o2")
        assert all(torch.equal(loaded[k], weights[k]) for k in weights)
    finally:
        (bare / "checkpoint-1").rename(run / "checkpoint-1")
