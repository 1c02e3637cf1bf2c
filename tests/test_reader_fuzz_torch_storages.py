"""A torch.save zip's storages against the records holding their bytes. torch trusts the element count and class
the pickle gives a storage: a storage class changed to a wider dtype (ComplexDouble for Float) makes it read past
the record, and, at an offset unaligned for that dtype, crashed the process in torch's copy kernels. Both readers
check every storage against its record before torch loads anything, and a file whose records another writer left
unaligned is copied out as bytes."""

from __future__ import annotations

import pickletools
import shutil
import subprocess
import sys
import zipfile

import pytest
import torch

from checkpoints.deepspeed_pickle import load_pickle
from checkpoints.source import CheckpointError
from deepspeed_crafting import rewrite_pickle
from helpers import FIXTURES, REPO, one_line_error, rewrite_torch_zip, zbench

MODEL_STATES = "zero_pp_rank_1_mp_rank_00_model_states.pt"


def _widen_first_storage(path) -> None:
    """The first storage class of `path`'s pickle (FloatStorage) named ComplexDoubleStorage instead: 4x the bytes."""

    def change(data: bytes) -> bytes:
        op, arg, pos = next(o for o in pickletools.genops(data) if o[0].name == "GLOBAL" and o[1].endswith("Storage"))
        end = pos + 1 + len(arg) + 1  # 'c', module, newline, name, newline
        return data[:pos] + b"ctorch\nComplexDoubleStorage\n" + data[end:]

    rewrite_pickle(path, change)


@pytest.fixture
def widened(tmp_path):
    root = tmp_path / "ck"
    shutil.copytree(FIXTURES / "deepspeed" / "3_2_fp32", root, ignore=shutil.ignore_patterns("expected*", "continued*"))
    _widen_first_storage(next(root.glob(f"*/{MODEL_STATES}")))
    return root


def test_a_storage_wider_than_its_record_is_refused_before_torch_reads_it(widened):
    with pytest.raises(CheckpointError, match=r"storage '0' claims 7 ComplexDouble elements but its record holds 28"):
        load_pickle(next(widened.glob(f"*/{MODEL_STATES}")))


@pytest.mark.parametrize("command", ["inspect", "convert"])
def test_readers_name_the_file_and_write_nothing(widened, tmp_path, command):
    done = zbench(*[str(a) for a in [command, widened, *(["--to", "fp32", "--out", tmp_path / "out"]
                                                         if command == "convert" else [])]])
    assert MODEL_STATES in one_line_error(done) and "claims 7 ComplexDouble elements" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]  # no output, no staging folder


_READ_UNALIGNED = """
import sys, torch
from pathlib import Path
from checkpoints.torch_file_reader import _MappedFile
from checkpoints.deepspeed_pickle import walk
path = Path(sys.argv[1])
opened = _MappedFile(path)  # where torch gives no record offsets, or ones that do not match the zip's
(t,) = walk(path, opened.structure)
assert t.untyped_storage().data_ptr() % 16, "the record should lie unaligned for complex128"
dst = torch.empty(t.numel(), dtype=t.dtype)
opened.read(t, 0, dst)
assert torch.equal(dst, torch.tensor([k * (1 + 2j) for k in range(7)], dtype=torch.complex128)), dst
"""


@pytest.mark.slow  # a few seconds
def test_a_record_another_writer_left_unaligned_is_read_as_bytes(tmp_path):
    """Python's zipfile writes records back to back: a complex128 storage lands at an odd offset of the mapping."""
    for pad in range(1, 17):
        path = tmp_path / f"{'p' * pad}.pt"
        torch.save({"w": torch.tensor([k * (1 + 2j) for k in range(7)], dtype=torch.complex128)}, path)
        rewrite_torch_zip(path, lambda name, data: data)
        with zipfile.ZipFile(path) as zf:
            info = next(i for i in zf.infolist() if "/data/" in i.filename)
        if (info.header_offset + 30 + len(info.filename)) % 16:
            break
    done = subprocess.run([sys.executable, "-c", _READ_UNALIGNED, str(path)], capture_output=True, text=True,
                          cwd=REPO, timeout=120)  # a crash in torch's kernels ends that process, not the suite
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_tensor_whose_strides_reach_past_its_storage_is_refused(tmp_path):
    """A universal fp32.pt whose first stride is 2**62: the tensor would span far more than its 77 stored elements
    (torch.empty of that span overflowed, a TypeError traceback, or asked for gigabytes)."""
    from checkpoint_helpers import UNIVERSAL
    from checkpoints.deepspeed_universal_source import UniversalSource
    from deepspeed_crafting import opcode

    folder = tmp_path / "ck"
    shutil.copytree(UNIVERSAL[0], folder, ignore=shutil.ignore_patterns("expected*", "continued*"))
    path = next(folder.glob("*/zero/emb.weight/fp32.pt"))

    def change(data: bytes) -> bytes:  # the first int after the size tuple that follows the storage: stride[0]
        ops = list(pickletools.genops(data))
        size = next(k for k in range(next(k for k, o in enumerate(ops) if o[0].name == "BINPERSID"), len(ops))
                    if ops[k][0].name.startswith("TUPLE"))
        k = next(k for k in range(size + 1, len(ops)) if ops[k][0].name.startswith("BININT"))
        return data[: ops[k][2]] + opcode(2**62) + data[ops[k + 1][2]:]

    rewrite_pickle(path, change)
    with pytest.raises(CheckpointError, match="reaches past its storage"):
        UniversalSource(next(folder.glob("global_step*"))).load("emb.weight")
