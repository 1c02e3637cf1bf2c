"""load_pretrained: a Hugging Face safetensors folder into a sharded engine, each rank reading its slices."""

from __future__ import annotations

import json

import pytest
import torch

import zero_core
from dist_harness import run_ranks
from init_workers import ds, pretrained_state, tiny_gpt2

pytestmark = pytest.mark.slow  # spawned ranks or whole runs: outside the fast tier (-m 'not slow')

transformers = pytest.importorskip("transformers")


def _saved(tmp_path, **kw):
    torch.manual_seed(42)
    model = tiny_gpt2()
    folder = tmp_path / "hf"
    model.save_pretrained(folder, **kw)
    return model.state_dict(), folder


@pytest.mark.slow
@pytest.mark.parametrize("shards,nvme", [(True, False), (False, True)])
def test_sharded_folder_loads_bitwise(tmp_path, monkeypatch, shards, nvme):
    monkeypatch.setenv("ZERO_CORE_NVME_CHUNK_NUMEL", "4096")
    want, folder = _saved(tmp_path, max_shard_size="20KB" if shards else "5GB")
    assert (folder / "model.safetensors.index.json").exists() == shards
    nvme_dir = tmp_path / "nvme"
    nvme_dir.mkdir()
    got = run_ranks(pretrained_state, 2, str(folder), str(nvme_dir) if nvme else None)["state"]
    assert set(got) == set(want)
    assert [k for k in want if not torch.equal(got[k], want[k])] == []


def _engine():
    torch.manual_seed(0)
    return zero_core.initialize(tiny_gpt2(), ds(3))


def test_names_map_strictly(tmp_path):
    want, folder = _saved(tmp_path)
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    tensors["transformer.extra"] = torch.zeros(2)
    del tensors["transformer.h.0.mlp.c_fc.weight"]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"missing \['transformer.h.0.mlp.c_fc.weight'\] \(1\), "
                                         r"unexpected \['transformer.extra'\] \(1\)"):
        zero_core.load_pretrained(_engine(), folder)


def test_index_cannot_point_outside_the_folder(tmp_path):
    _, folder = _saved(tmp_path, max_shard_size="20KB")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    first = next(iter(index["weight_map"]))
    index["weight_map"][first] = "../../etc/passwd"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="points outside"):
        zero_core.load_pretrained(_engine(), folder)


def test_not_a_pretrained_folder(tmp_path):
    with pytest.raises(ValueError, match="has neither model.safetensors nor"):
        zero_core.load_pretrained(_engine(), tmp_path)
