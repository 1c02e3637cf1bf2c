"""Checksums computed while writing equal a fresh hash of the file; loads check them in the same pass; format-2
manifests (sha256) are still read and checked."""

from __future__ import annotations

import json

import pytest
import torch

import zero_core
from checkpoints import checksums
from checkpoints import manifest as mf
from checkpoints.safetensors_stream import write_tensors
from checkpoints.source import CheckpointError
from ckpt_workers import _train, config
from parity_workers import make_model


@pytest.mark.parametrize("algorithm", sorted(checksums.ALGORITHMS))
def test_the_hash_taken_while_writing_is_the_files_hash(tmp_path, monkeypatch, algorithm):
    monkeypatch.setattr(checksums, "DEFAULT", algorithm)
    path = tmp_path / "x.safetensors"
    big = torch.randn((1 << 22) + 3)  # more than one 16 MiB write
    rec = write_tensors(path, {"big": big, "small": torch.arange(5)})
    assert rec == checksums.file_record(path, algorithm) and rec["hash"] == algorithm
    assert rec["bytes"] == path.stat().st_size


def _saved(tmp_path):
    engine = zero_core.initialize(make_model(), config(2, 1))
    _train(engine, 0, 1, range(1))
    engine.save_checkpoint(tmp_path / "ck")
    return engine, tmp_path / "ck" / "global_step1"


def test_manifest_names_the_algorithm_and_a_flipped_byte_fails_the_load(tmp_path):
    engine, tag = _saved(tmp_path)
    entry = mf.read(tag)["files"]["rank_00000.safetensors"]
    assert entry["hash"] == checksums.DEFAULT and "sha256" not in entry
    victim = tag / "rank_00000.safetensors"
    data = bytearray(victim.read_bytes())
    data[-5] ^= 1
    victim.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"rank_00000.safetensors fails its {checksums.DEFAULT} checksum"):
        engine.load_checkpoint(tag.parent)


def test_a_format_2_manifest_with_sha256_is_still_read_and_checked(tmp_path):
    import hashlib

    engine, tag = _saved(tmp_path)
    m = json.loads((tag / mf.MANIFEST).read_text())
    m["version"] = 2
    m["files"] = {
        n: {"sha256": checksums.file_digest(tag / n, "sha256"), "bytes": e["bytes"]} for n, e in m["files"].items()
    }
    data = json.dumps(m).encode()
    (tag / mf.MANIFEST).write_bytes(data)
    (tag / mf.CHECKSUM).write_text(f"{hashlib.sha256(data).hexdigest()}  {mf.MANIFEST}\n")
    before = engine.full_state_dict()
    engine.load_checkpoint(tag.parent)
    assert all(torch.equal(before[k], v) for k, v in engine.full_state_dict().items())
    (tag / "frozen.safetensors").write_bytes((tag / "frozen.safetensors").read_bytes()[:-1] + b"\x07")
    with pytest.raises(CheckpointError, match="frozen.safetensors fails its sha256 checksum"):
        engine.load_checkpoint(tag.parent)
