"""The recovery functions a save's zero_to_fp32.py / zero_to_torch.py call, and
get_fp32_state_dict_from_zero_checkpoint, check every file's checksum before a weight is returned or written: a
damaged zbench file is one CheckpointError naming it and nothing is written, where it was converted into wrong
weights before (DeepSpeed's verify nothing)."""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys

import pytest
from fault_workers import tiny_checkpoint
from helpers import one_line_error

from checkpoints.source import CheckpointError
from zero_core import recovery_script
from zero_core.deepspeed.utils.zero_to_fp32 import (
    convert_zero_checkpoint_to_state_dict,
    get_fp32_state_dict_from_zero_checkpoint,
)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "ckpt")


@pytest.fixture
def damaged(saved, tmp_path):
    """A copy whose frozen.safetensors has one bit of its first tensor flipped (its recorded checksum kept)."""
    root = tmp_path / "ck"
    shutil.copytree(saved, root)
    path = next(root.glob("*/frozen.safetensors"))
    data = bytearray(path.read_bytes())
    data[8 + struct.unpack("<Q", data[:8])[0]] ^= 0x04
    path.write_bytes(bytes(data))
    return root


@pytest.mark.parametrize("call", ["state dict", "bin", "safetensors", "bf16"])
def test_a_damaged_file_is_named_and_nothing_written(damaged, tmp_path, call):
    out = tmp_path / "out"
    with pytest.raises(CheckpointError, match=r"frozen\.safetensors fails its .* checksum") as e:
        if call == "state dict":
            get_fp32_state_dict_from_zero_checkpoint(damaged)
        else:
            convert_zero_checkpoint_to_state_dict(damaged, out, dtype="bf16" if call == "bf16" else "fp32",
                                                  safe_serialization=call == "safetensors")
    assert "\n" not in str(e.value) and not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


@pytest.mark.slow  # the saved script in a subprocess
def test_the_saved_script_says_so_in_one_line(damaged, tmp_path):
    script = tmp_path / recovery_script.NAME  # the script a DeepSpeed-API engine's save writes beside `latest`
    script.write_text(recovery_script.SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(damaged), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300)
    assert "frozen.safetensors fails its" in one_line_error(done, alone=True)
    assert not (tmp_path / "out").exists()
