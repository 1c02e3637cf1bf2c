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
    w = StreamingWriter(tmp_path / "x.safetensors", [("a", a.dtype, a.shape), ("e", empty.dtype, empty.shape), ("b", b.dtype, b.shape)],
                        metadata={"alias.b": "b"})
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
