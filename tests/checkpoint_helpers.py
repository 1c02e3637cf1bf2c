"""Shared by the checkpoint reader/converter tests: the committed checkpoint fixtures, a bit flip inside one."""

from __future__ import annotations

from pathlib import Path

from helpers import FIXTURES

DEEPSPEED = sorted(p for p in (FIXTURES / "deepspeed").iterdir() if p.is_dir())  # <stage>_<world>_<dtype>[_groups]
UNIVERSAL = sorted(p for p in (FIXTURES / "deepspeed_universal").iterdir() if p.is_dir())
DCP = sorted(p for p in (FIXTURES / "dcp").iterdir() if p.is_dir())


def flip_tensor_byte(path: Path, base: int = 0, length: int | None = None) -> None:
    """Flip one bit inside the first tensor record of the torch.save zip at bytes [base, base+length) of `path`.

    (Bytes elsewhere, e.g. alignment padding, are covered by no checksum and change no value.)
    """
    import io
    import zipfile

    data = bytearray(Path(path).read_bytes())
    end = len(data) if length is None else base + length
    with zipfile.ZipFile(io.BytesIO(bytes(data[base:end]))) as zf:
        info = next(i for i in zf.infolist() if "/data/" in i.filename and i.file_size > 8)
        start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    data[base + start + info.file_size // 2] ^= 0x04
    Path(path).write_bytes(bytes(data))


def flip_element(path: Path, tensor, at: int) -> None:
    """Flip a bit of element `at` of `tensor`'s bytes as they lie in the file (found by content)."""
    import torch

    raw = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    data = bytearray(path.read_bytes())
    start = data.find(raw)
    assert start > 0 and data.find(raw, start + 1) < 0
    data[start + at * tensor.element_size()] ^= 0x04
    path.write_bytes(bytes(data))
