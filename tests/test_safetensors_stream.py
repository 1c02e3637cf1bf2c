"""The streaming safetensors writer produces files safetensors itself reads back exactly."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from checkpoints.safetensors_stream import StreamingWriter


def test_pieces_round_trip(tmp_path):
    a = torch.randn(7, 3)
    b = torch.randn(11).to(torch.bfloat16)
    empty = torch.empty(0, 4)
    w = StreamingWriter(
        tmp_path / "x.safetensors",
        [("a", a.dtype, a.shape), ("e", empty.dtype, empty.shape), ("b", b.dtype, b.shape)],
        metadata={"alias.b": "b"},
    )
    flat = a.reshape(-1)
    w.write(flat[:5])
    w.write(flat[5:])
    w.write(b[:1])
    w.write(b[1:])
    w.close()
    with safe_open(str(tmp_path / "x.safetensors"), "pt") as f:
        assert torch.equal(f.get_tensor("a"), a) and torch.equal(f.get_tensor("b"), b)
        assert f.get_tensor("e").shape == (0, 4)
        assert f.metadata() == {"alias.b": "b"}


def test_misuse_is_reported(tmp_path):
    w = StreamingWriter(tmp_path / "y.safetensors", [("a", torch.float32, [4])])
    with pytest.raises(ValueError, match="expected torch.float32"):
        w.write(torch.zeros(2, dtype=torch.float16))
    with pytest.raises(ValueError, match="past its declared size"):
        w.write(torch.zeros(5))
    w.write(torch.zeros(3))
    with pytest.raises(ValueError, match="closed before"):
        w.close()


def test_positioned_reads_match_safetensors(tmp_path):
    from safetensors.torch import save_file

    from checkpoints.safetensors_read import SafetensorsFile
    from checkpoints.source import CheckpointError

    t = {"a": torch.randn(1000), "b": torch.randn(3, 5).to(torch.float16)}
    save_file(t, str(tmp_path / "z.safetensors"))
    with SafetensorsFile(tmp_path / "z.safetensors") as f:
        out = torch.empty(17)
        f.read_into("a", 400, out)
        assert torch.equal(out, t["a"][400:417])
        assert torch.equal(f.read("b"), t["b"])
        with pytest.raises(ValueError, match="outside"):
            f.read_into("a", 990, torch.empty(17))
    data = (tmp_path / "z.safetensors").read_bytes()
    (tmp_path / "short.safetensors").write_bytes(data[:-10])
    with pytest.raises(CheckpointError, match="truncated"):
        SafetensorsFile(tmp_path / "short.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        SafetensorsFile(tmp_path / "junk.safetensors")
