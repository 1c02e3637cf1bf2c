"""Checkpoint files written and read through aligned buffers, with O_DIRECT and with the buffered fallback.

Every written file must equal what safetensors itself writes for the same tensors, whatever the ring and
block sizes cut; every read must hand back the file's bytes and catch damage. Each test runs on the O_DIRECT
path (skipped where the test folder's filesystem refuses it), on a filesystem refusing O_DIRECT at open, and
on one that takes the open but refuses the first direct transfer.
"""

from __future__ import annotations

import errno
import json
import os
import struct

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save

from checkpoints import checksums, direct_io, staged_write, verified_read
from checkpoints.safetensors_stream import StreamingWriter
from checkpoints.source import CheckpointError
from checkpoints.verified_read import Span, read_verified


def _refuse_at_open(monkeypatch):
    real = os.open

    def fake(path, flags, *args, **kwargs):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", fake)


def _refuse_transfers(monkeypatch):
    """The open succeeds with O_DIRECT, every direct pwrite/preadv fails with EINVAL (some FUSE filesystems)."""
    for name in ("pwrite", "preadv"):
        real = getattr(os, name)

        def fake(fd, *args, _real=real):
            if direct_io.is_direct(fd):
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
            return _real(fd, *args)

        monkeypatch.setattr(os, name, fake)


@pytest.fixture(params=["direct", "refused_at_open", "refused_at_transfer"])
def io_path(request, tmp_path, monkeypatch):
    """Which path the file I/O takes; the list of O_DIRECT states seen at each pwrite/preadv is returned."""
    fd, direct = direct_io.open_file(tmp_path / "probe", os.O_WRONLY | os.O_CREAT)
    os.close(fd)
    if request.param == "direct" and not direct:
        pytest.skip(f"{tmp_path}'s filesystem refuses O_DIRECT")
    if request.param == "refused_at_open":
        _refuse_at_open(monkeypatch)
    elif request.param == "refused_at_transfer":
        _refuse_transfers(monkeypatch)
    seen: list[bool] = []
    for name in ("pwrite", "preadv"):
        inner = getattr(os, name)

        def spy(fd, *args, _inner=inner):
            out = _inner(fd, *args)
            seen.append(direct_io.is_direct(fd))
            return out

        monkeypatch.setattr(os, name, spy)
    return request.param, seen


@pytest.fixture
def small_ring(monkeypatch):
    """Ring buffers and read chunks of two blocks: a few KiB of tensors cross many buffers."""
    monkeypatch.setattr(staged_write, "PIECE_BYTES", 2 * direct_io.ALIGN)
    monkeypatch.setattr(staged_write, "HOST_PIECE_BYTES", 2 * direct_io.ALIGN)
    monkeypatch.setattr(verified_read, "CHUNK_BYTES", 2 * direct_io.ALIGN)


def _cases() -> dict[str, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    many = {f"t{i:03d}": torch.randn(i % 7 + 1, generator=g) for i in range(150)}
    return {
        "unaligned": {"a": torch.randn(1001, generator=g), "b": torch.randn(3, 333, generator=g).half(),
                      "c": torch.arange(77), "d": torch.rand(13, generator=g) > 0.5},
        "empty": {"e0": torch.empty(0), "x": torch.randn(5, generator=g), "e1": torch.empty(0, 3)},
        "many_small": many,
        "larger_than_the_ring": {"big": torch.randn(40_000 + 3, generator=g), "tail": torch.randn(9, generator=g)},
        "nothing": {},
    }


def _reference(tensors: dict[str, torch.Tensor]) -> tuple[bytes, list[str]]:
    """safetensors' own bytes for these tensors and the order its header lists them in."""
    ref = save(tensors)
    (n,) = struct.unpack("<Q", ref[:8])
    return ref, [k for k in json.loads(ref[8 : 8 + n]) if k != "__metadata__"]


def _write(path, tensors: dict[str, torch.Tensor], order: list[str], piece: int) -> dict:
    w = StreamingWriter(path, [(k, tensors[k].dtype, tensors[k].shape) for k in order])
    for k in order:
        flat = tensors[k].reshape(-1)
        for lo in range(0, flat.numel(), piece):  # pieces that end anywhere inside the ring's buffers
            w.write(flat[lo : lo + piece])
    return w.close()


@pytest.mark.parametrize("case", list(_cases()))
def test_written_files_equal_safetensors_own(tmp_path, io_path, small_ring, case):
    mode, seen = io_path
    tensors = _cases()[case]
    ref, order = _reference(tensors)
    path = tmp_path / f"{case}.safetensors"
    rec = _write(path, tensors, order, piece=997)
    assert path.read_bytes() == ref
    assert rec == {"bytes": len(ref), "hash": checksums.DEFAULT, "digest": checksums.file_digest(path)}
    with safe_open(str(path), "pt") as f:
        assert sorted(f.keys()) == sorted(tensors)
        for k, t in tensors.items():
            assert torch.equal(f.get_tensor(k), t)
    assert seen and all(seen) == (mode == "direct") and any(seen) == (mode == "direct"), seen


def test_default_ring_sizes_and_whole_tensors(tmp_path, io_path):
    """A tensor of several default-sized buffers, written whole (as a synchronous save does)."""
    t = {"w": torch.randn(3 * staged_write.HOST_PIECE_BYTES // 4 + 5)}  # 3 host buffers and a bit
    ref, _ = _reference(t)
    w = StreamingWriter(tmp_path / "w.safetensors", [("w", torch.float32, t["w"].shape)])
    w.write(t["w"])
    assert w.close()["bytes"] == len(ref)
    assert (tmp_path / "w.safetensors").read_bytes() == ref


def test_host_sources_stage_through_smaller_buffers(tmp_path):
    """A convert or a CPU save streams from host memory: its ring is 4 x 8 MiB, not the GPU path's 4 x 32 MiB
    (the converter's peak memory bound counts it)."""
    w = staged_write.StagedWriter(tmp_path / "w.bin", checksums.new_hasher(checksums.DEFAULT), 1 << 30, pinned=False)
    w.append(torch.arange(10, dtype=torch.uint8))
    assert w._piece == staged_write.HOST_PIECE_BYTES and staged_write.HOST_PIECE_BYTES * staged_write.RING <= 32 << 20
    assert w.finish() == 10 and (tmp_path / "w.bin").read_bytes() == bytes(range(10))


def test_a_failed_write_surfaces_and_leaves_no_open_file(tmp_path, monkeypatch, small_ring):
    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(direct_io, "write_at", full)
    before = len(os.listdir("/proc/self/fd"))
    w = StreamingWriter(tmp_path / "f.safetensors", [("a", torch.float32, [100_000])])
    with pytest.raises(OSError) as e:
        w.write(torch.zeros(100_000))
        w.close()
    assert e.value.errno == errno.ENOSPC
    w.abandon()
    assert len(os.listdir("/proc/self/fd")) == before


def _spans(size: int, g: torch.Generator) -> list[tuple[int, int]]:
    """Ranges at unaligned offsets, some crossing chunk boundaries, one of the whole file."""
    out = [(0, size)]
    for _ in range(20):
        lo = int(torch.randint(0, size, (1,), generator=g))
        out.append((lo, min(size, lo + int(torch.randint(1, 3 * direct_io.ALIGN, (1,), generator=g)))))
    return out


@pytest.mark.parametrize("case", ["unaligned", "larger_than_the_ring", "many_small"])
def test_reads_hand_back_the_files_bytes(tmp_path, io_path, small_ring, case):
    mode, seen = io_path
    tensors = _cases()[case]
    ref, order = _reference(tensors)
    path = tmp_path / "r.safetensors"
    path.write_bytes(ref)
    entry = checksums.file_record(path)
    ranges = _spans(len(ref), torch.Generator().manual_seed(1))
    seen.clear()
    spans = [Span(lo, torch.empty(hi - lo, dtype=torch.uint8)) for lo, hi in ranges]
    read_verified(path, entry, spans)
    for (lo, hi), s in zip(ranges, spans):
        assert s.dst.numpy().tobytes() == ref[lo:hi]
    assert seen and all(seen) == (mode == "direct") and any(seen) == (mode == "direct"), seen


def test_damage_is_caught_on_every_path(tmp_path, io_path, small_ring, monkeypatch):
    ref, _ = _reference(_cases()["larger_than_the_ring"])
    path = tmp_path / "d.safetensors"
    path.write_bytes(ref)
    entry = checksums.file_record(path)
    whole = [Span(0, torch.empty(len(ref), dtype=torch.uint8))]

    damaged = bytearray(ref)
    damaged[len(ref) // 2 + 1] ^= 1
    path.write_bytes(bytes(damaged))
    with pytest.raises(CheckpointError, match="fails its .* checksum"):
        read_verified(path, entry, whole)

    path.write_bytes(ref[:-3])
    with pytest.raises(CheckpointError, match="truncated or padded"):
        read_verified(path, entry, whole)

    # a file that shrinks after its size was checked: the reads come back short
    real_fstat = os.fstat

    class Grown:
        def __init__(self, st):
            self.st_size = st.st_size + 3

    monkeypatch.setattr(os, "fstat", lambda fd: Grown(real_fstat(fd)))
    with pytest.raises(CheckpointError, match="ended early"):
        read_verified(path, entry, whole)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_tensors_stream_through_pinned_buffers_and_back(tmp_path, io_path, small_ring):
    """A synchronous save hands the writer live GPU tensors; a load reads into GPU destinations."""
    tensors = _cases()["larger_than_the_ring"]
    ref, order = _reference(tensors)
    path = tmp_path / "g.safetensors"
    rec = _write(path, {k: t.cuda() for k, t in tensors.items()}, order, piece=997)
    assert path.read_bytes() == ref and rec["digest"] == checksums.file_digest(path)
    ranges = _spans(len(ref), torch.Generator().manual_seed(2))
    spans = [Span(lo, torch.empty(hi - lo, dtype=torch.uint8, device="cuda")) for lo, hi in ranges]
    read_verified(path, rec, spans)
    for (lo, hi), s in zip(ranges, spans):
        assert s.dst.cpu().numpy().tobytes() == ref[lo:hi]


def test_host_sources_never_pin_so_no_cuda_context_is_made(tmp_path, monkeypatch):
    """Pinning needs a CUDA context (hundreds of MiB of GPU memory): a convert, an NVMe stream or an async save's
    host copies on a GPU node must not make one. Only GPU sources get page-locked staging buffers."""
    from checkpoints import direct_io, staged_write
    from checkpoints.safetensors_stream import write_tensors

    asked = []
    real = direct_io.aligned_buffer
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as on a GPU node
    def record(nbytes: int, pinned: bool) -> torch.Tensor:
        asked.append(pinned)
        return real(nbytes, False)

    monkeypatch.setattr(staged_write.direct_io, "aligned_buffer", record)
    write_tensors(tmp_path / "h.safetensors", {"a": torch.arange(10_000, dtype=torch.float32)})
    w = StreamingWriter(tmp_path / "s.safetensors", [("a", torch.float32, [3])])
    w.write(torch.ones(3))
    w.close()
    assert asked and not any(asked)


def test_a_refusal_another_writer_already_answered_is_retried_buffered(tmp_path, monkeypatch):
    """Writers share a file: the refusal of a direct transfer may reach this one after another writer has turned
    O_DIRECT off. Its write goes on buffered; it used to re-raise the refusal, as if it were a real I/O error."""
    fd, direct = direct_io.open_file(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    if not direct:
        os.close(fd)
        pytest.skip(f"{tmp_path}'s filesystem refuses O_DIRECT")
    real = os.pwrite

    def refused_after_another_writer(fd_, data, offset):
        if direct_io.is_direct(fd_):
            direct_io.go_buffered(fd_)  # what the other writer's refusal did meanwhile
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return real(fd_, data, offset)

    monkeypatch.setattr(os, "pwrite", refused_after_another_writer)
    data = bytes(range(256)) * 16
    direct_io.write_at(fd, memoryview(data), 0)
    os.close(fd)
    assert (tmp_path / "f").read_bytes() == data
