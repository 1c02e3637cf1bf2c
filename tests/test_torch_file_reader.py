"""checkpoints/torch_file_reader.py: tensors read where they lie equal torch's own load, and every byte of a
record read from is CRC-checked (gaps and unread ends too) while records never read are left alone; the same
holds where torch notes no offsets and the reader falls back to a memory mapping and a whole-file check."""

from __future__ import annotations

import pytest
import torch

from checkpoints import torch_file_reader
from checkpoints.source import CheckpointError
from checkpoints.torch_file_reader import TorchFileReader
from checkpoint_helpers import flip_element


@pytest.fixture(params=["positioned", "mapped"])
def mode(request, monkeypatch):
    if request.param == "mapped":  # an older torch: no offsets on meta storages
        monkeypatch.setattr(torch_file_reader, "meta_offsets_supported", lambda: False)
    elif not torch_file_reader.meta_offsets_supported():
        pytest.skip("this torch notes no record offsets on meta storages")
    return request.param


def _save(path, n=50_000):
    flat = torch.arange(n, dtype=torch.float32)
    base = torch.randn(64, 48)
    state = {
        "flat": flat,
        "moment": torch.full((n,), 3.0),
        "view": base[5:, 7:].t(),  # a strided view that starts inside its storage
        "half": torch.arange(100, dtype=torch.bfloat16),
        "step": torch.tensor(7),
    }
    torch.save(state, path)
    return state


def test_reads_equal_torch_load(tmp_path, mode):
    path = tmp_path / "a.pt"
    state = _save(path)
    reader = TorchFileReader()
    meta = reader.get(path)
    out = torch.empty(50_000)
    for lo in range(0, 50_000, 7_000):  # in pieces, as the converter reads a partition
        hi = min(lo + 7_000, 50_000)
        reader.read(path, meta["flat"], lo, out[lo:hi])
    assert torch.equal(out, state["flat"])
    for key in ("view", "half", "step"):
        got = reader.tensor(path, meta[key])
        assert got.dtype == state[key].dtype and torch.equal(got, state[key]), key
    assert reader.problems() == []


@pytest.mark.parametrize("where", [10, 20_000, 49_999])  # read first, in the gap, in the unread end
def test_a_flip_in_a_record_read_from_is_found(tmp_path, mode, where):
    path = tmp_path / "a.pt"
    state = _save(path)
    flip_element(path, state["flat"], where)
    reader = TorchFileReader()
    meta = reader.get(path)
    reader.read(path, meta["flat"], 0, torch.empty(100))
    reader.read(path, meta["flat"], 30_000, torch.empty(100))  # skips [100, 30000): read again for the CRC
    problems = reader.problems()
    assert len(problems) == 1 and problems[0].startswith(f"{path} is corrupt: record ")
    assert "CRC" in problems[0]


def test_a_flip_in_a_record_never_read(tmp_path, mode):
    path = tmp_path / "a.pt"
    state = _save(path)
    flip_element(path, state["moment"], 123)
    reader = TorchFileReader()
    out = torch.empty(50_000)
    reader.read(path, reader.get(path)["flat"], 0, out)
    assert torch.equal(out, state["flat"])
    # the positioned reader checks what it read; the mapped fallback can only check whole files
    assert (reader.problems() == []) == (mode == "positioned")


def test_more_files_than_kept_open(tmp_path, mode, monkeypatch):
    monkeypatch.setattr(torch_file_reader, "_OPEN_FILES", 3)
    paths = [tmp_path / f"{k}.pt" for k in range(8)]
    states = [_save(p, n=1000 + k) for k, p in enumerate(paths)]
    flip_element(paths[2], states[2]["flat"], 999)  # the unread end of a file closed long before the check
    reader = TorchFileReader()
    for p, s in zip(paths, states):
        head = torch.empty(500)
        reader.read(p, reader.get(p)["flat"], 0, head)
        assert torch.equal(head, s["flat"][:500])
    problems = reader.problems()
    assert len(problems) == 1 and problems[0].startswith(f"{paths[2]} is corrupt")


def test_truncated_file(tmp_path, mode):
    path = tmp_path / "a.pt"
    _save(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        TorchFileReader().get(path)


def test_refuses_code(tmp_path, mode):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    torch.save({"x": Evil()}, tmp_path / "evil.pt")
    with pytest.raises(CheckpointError, match="refuses to load"):
        TorchFileReader().get(tmp_path / "evil.pt")


def test_a_storage_larger_than_its_record_is_refused(tmp_path, mode):
    """A pickle that claims more bytes than its record holds (sizes would otherwise be taken from it)."""
    import zipfile

    small, big = tmp_path / "small.pt", tmp_path / "big.pt"
    torch.save(torch.zeros(10), small)
    torch.save(torch.zeros(1_000_000), big)
    crafted = tmp_path / "crafted.pt"
    with zipfile.ZipFile(small) as s, zipfile.ZipFile(big) as b, zipfile.ZipFile(crafted, "w") as out:
        for info in s.infolist():
            if info.filename.endswith(".format_version"):
                continue  # torch then takes each record's offset from the zip directory
            name = info.filename.replace("small/", "crafted/")
            source = b if info.filename.endswith("data.pkl") else s
            out.writestr(name, source.read(info.filename.replace("small/", "big/") if source is b else info.filename))
    with pytest.raises(CheckpointError, match="corrupt"):
        reader = TorchFileReader()
        reader.tensor(crafted, reader.get(crafted))


def test_a_flat_read_of_a_strided_tensor_is_refused(tmp_path, mode):
    """Partitions are read flat; a tensor stored with strides is not one (a crafted or foreign file)."""
    path = tmp_path / "a.pt"
    torch.save({"flat": torch.randn(6, 4).t()}, path)
    reader = TorchFileReader()
    with pytest.raises(CheckpointError, match="stored with strides"):
        reader.read(path, reader.get(path)["flat"], 0, torch.empty(4))
