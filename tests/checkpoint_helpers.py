"""Shared by the checkpoint reader/converter tests: fixture paths, one-line error checks, disk snapshots."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
DEEPSPEED = sorted(p for p in (FIXTURES / "deepspeed").iterdir() if p.is_dir())  # <stage>_<world>_<dtype>
UNIVERSAL = sorted(p for p in (FIXTURES / "deepspeed_universal").iterdir() if p.is_dir())
DCP = sorted(p for p in (FIXTURES / "dcp").iterdir() if p.is_dir())


def one_line_error(result) -> str:
    """A click result that failed with exactly one `Error: ...` line and no traceback."""
    assert result.exit_code != 0, result.output
    out = result.output.strip()
    assert "Traceback" not in out, out
    last = out.splitlines()[-1]
    assert last.startswith("Error: "), out
    return last


def snapshot(root: Path) -> dict[str, str]:
    """Every file and folder under `root` with a sha256 of each file: to show nothing changed."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for d in dirs:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = "dir"
        for f in files:
            p = os.path.join(dirpath, f)
            out[os.path.relpath(p, root)] = hashlib.sha256(Path(p).read_bytes()).hexdigest()
    return out


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
