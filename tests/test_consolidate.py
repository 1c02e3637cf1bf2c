"""Consolidated safetensors output: single file or HF-style shards + index, ties, dtypes, atomicity."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from checkpoint_helpers import DEEPSPEED
from helpers import snapshot
from checkpoints.consolidate import parse_size, plan_shards, write_consolidated
from checkpoints.detect import open_source
from checkpoints.source import CheckpointError, ParamInfo, SourceSummary

FIXTURE = next(p for p in DEEPSPEED if p.name == "3_3_bf16")


class DictSource:
    """A CheckpointSource over a dict, optionally failing at one name."""

    def __init__(
        self, tensors: dict[str, torch.Tensor], tied: dict[str, str] | None = None, fail_at: str | None = None
    ):
        self.tensors, self.tied, self.fail_at = tensors, tied or {}, fail_at

    def params(self) -> list[ParamInfo]:
        infos = [ParamInfo(n, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in self.tensors.items()]
        return infos + [ParamInfo(a, tuple(self.tensors[o].shape), "float32", tied_to=o) for a, o in self.tied.items()]

    def load(self, name: str) -> torch.Tensor:
        if name == self.fail_at:
            raise CheckpointError(f"rank file for {name} is truncated")
        t = self.tensors[self.tied.get(name, name)]
        return t.float() if t.is_floating_point() else t

    def summary(self) -> SourceSummary:
        return SourceSummary("test", "-", None, None, None, 0)

    def verify(self) -> list[str]:
        return []


def test_parse_size():
    assert parse_size("5GB") == 5 * 10**9 and parse_size("500MiB") == 500 * 2**20
    assert parse_size("1000") == 1000 and parse_size("1.5kb") == 1500 and parse_size(7) == 7
    for bad in ("lots", "5 parsecs", "0", ""):
        with pytest.raises(ValueError, match="size"):
            parse_size(bad)


def test_plan_shards_starts_a_shard_when_the_next_tensor_would_not_fit():
    assert plan_shards([("a", 4), ("b", 4), ("c", 9), ("d", 1)], 8) == [["a", "b"], ["c"], ["d"]]


def test_single_file_keeps_one_copy_of_tied_weights(tmp_path):
    src = open_source(FIXTURE)
    files = write_consolidated(src, tmp_path / "out", torch.float32, parse_size("5GB"), progress=False)
    assert files == [tmp_path / "out" / "model.safetensors"]
    expected = load_file(FIXTURE / "expected_fp32.safetensors")
    with safe_open(str(files[0]), "pt") as f:
        assert f.metadata()["alias.head.weight"] == "emb.weight"
        assert set(f.keys()) == set(expected) - {"head.weight"}
        for name in f.keys():
            assert torch.equal(f.get_tensor(name), expected[name].float()), name


def test_shards_and_index_load_back_to_the_same_tensors(tmp_path):
    src = open_source(FIXTURE)
    files = write_consolidated(src, tmp_path / "out", torch.float32, max_shard_size=400, progress=False)
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    shards = sorted(f.name for f in files if f.suffix == ".safetensors")
    assert len(shards) > 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert sorted(set(index["weight_map"].values())) == shards
    assert index["weight_map"]["head.weight"] == index["weight_map"]["emb.weight"]  # tied: both names, one copy
    expected = load_file(FIXTURE / "expected_fp32.safetensors")
    assert set(index["weight_map"]) == set(expected)
    stored = {}
    for shard in shards:
        part = load_file(tmp_path / "out" / shard)
        assert sum(t.numel() * 4 for t in part.values()) <= 400 or len(part) == 1
        stored.update(part)
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in stored.values())
    for name, shard in index["weight_map"].items():
        key = {"head.weight": "emb.weight"}.get(name, name)  # the alias is stored under its owner
        assert torch.equal(load_file(tmp_path / "out" / shard)[key], expected[name].float()), name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_outputs_are_the_fp32_values_cast(tmp_path, dtype):
    tensors = {"w": torch.randn(5, 3), "empty": torch.empty(0, 2), "steps": torch.arange(4, dtype=torch.int64)}
    write_consolidated(DictSource(tensors), tmp_path / "out", dtype, 10**9, progress=False)
    out = load_file(tmp_path / "out" / "model.safetensors")
    assert out["w"].dtype == dtype and torch.equal(out["w"], tensors["w"].to(dtype))
    assert out["empty"].shape == (0, 2)
    assert out["steps"].dtype == torch.int64 and torch.equal(out["steps"], tensors["steps"])  # integer buffers kept


def test_refuses_an_output_folder_that_holds_files(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    before = snapshot(tmp_path)
    with pytest.raises(CheckpointError, match="already holds files"):
        write_consolidated(DictSource({"w": torch.ones(2)}), tmp_path / "out", torch.float32, 10**9, progress=False)
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError, match="is a file, not a folder"):
        write_consolidated(DictSource({"w": torch.ones(2)}), tmp_path / "file", torch.float32, 10**9, progress=False)
    (tmp_path / "file").unlink()
    assert snapshot(tmp_path) == before


def test_a_failure_midway_leaves_nothing_behind(tmp_path):
    src = DictSource({"a": torch.ones(3), "b": torch.ones(4), "c": torch.ones(5)}, fail_at="b")
    before = snapshot(tmp_path)
    with pytest.raises(CheckpointError, match="truncated"):
        write_consolidated(src, tmp_path / "new" / "deeper" / "out", torch.float32, 8, progress=False)
    assert snapshot(tmp_path) == before
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError):
        write_consolidated(src, tmp_path / "empty", torch.float32, 8, progress=False)
    assert list((tmp_path / "empty").iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["empty"]
