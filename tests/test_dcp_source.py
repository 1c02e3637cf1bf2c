"""torch.distributed.checkpoint folders saved from FSDP2 read back as the model's full state dict."""

from __future__ import annotations

import pickle
import shutil

import pytest
import torch
from safetensors.torch import load_file

from checkpoint_helpers import DCP, flip_tensor_byte
from checkpoints.dcp_source import DcpSource
from checkpoints.detect import open_source
from checkpoints.source import CheckpointError


@pytest.mark.parametrize("folder", DCP, ids=lambda p: p.name)
def test_matches_the_fsdp2_full_state_dict(folder):
    src = open_source(folder)
    assert isinstance(src, DcpSource)
    expected = load_file(folder / "expected_full.safetensors")
    assert [i.name for i in src.params()] == [
        "mix",
        "emb.weight",
        "lin1.weight",
        "lin1.bias",
        "norm.weight",
        "norm.bias",
        "lin2.weight",
        "lin2.bias",
        "head.weight",
    ]
    for name, want in expected.items():
        assert torch.equal(src.load(name), want), name
    s = src.summary()
    assert (s.kind, s.world_size, s.step) == ("dcp", 2, 2 if folder.name in ("model_optim", "app_state") else None)
    assert src.verify() == []


def test_crafted_metadata_cannot_run_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("this must not run",))

    (tmp_path / ".metadata").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(CheckpointError, match=r"\.metadata is truncated, corrupt or not DCP metadata"):
        open_source(tmp_path)


def test_truncated_and_flipped_chunk_files_are_named(tmp_path):
    folder = tmp_path / "ck"
    shutil.copytree(DCP[0], folder)
    victim = folder / "__1_0.distcp"
    chunk = max(
        (i for i in DcpSource(folder).metadata.storage_data.values() if i.relative_path == victim.name),
        key=lambda i: i.length,
    )
    flip_tensor_byte(victim, base=chunk.offset, length=chunk.length)
    problems = DcpSource(folder).verify()
    assert len(problems) == 1 and "__1_0.distcp is corrupt" in problems[0]
    data = (DCP[0] / victim.name).read_bytes()
    victim.write_bytes(data[: len(data) // 3])
    src = DcpSource(folder)
    assert any("__1_0.distcp is truncated" in p for p in src.verify())
    with pytest.raises(CheckpointError, match="__1_0.distcp"):
        for info in src.params():
            src.load(info.name)
    victim.unlink()
    with pytest.raises(CheckpointError, match=r"missing rank file .*__1_0\.distcp"):
        DcpSource(folder)


def test_entries_that_share_bytes_are_refused(tmp_path):
    """Each storage entry of a real DCP checkpoint has bytes of its own. Pointing every tensor at the largest
    chunk's bytes would let a small folder claim its files' size many times over (and a convert write it)."""
    folder = tmp_path / "ck"
    shutil.copytree(DCP[0], folder)
    md = DcpSource(folder).metadata
    largest = max(md.storage_data.values(), key=lambda i: i.length)
    md.storage_data = {index: largest for index in md.storage_data}
    (folder / ".metadata").write_bytes(pickle.dumps(md))
    with pytest.raises(CheckpointError, match=r"gives bytes .* to two entries") as e:
        open_source(folder)
    assert "\n" not in str(e.value)
