"""A shard size given as a number (`convert_zero_checkpoint_to_state_dict(max_shard_size=...)`) is checked as the
text form is: zero, a negative number or a bool is one ValueError line, before anything is written, instead of
a folder of one-tensor shards."""

from __future__ import annotations

import pytest

from checkpoint_helpers import DEEPSPEED
from checkpoints.consolidate import parse_size
from zero_core.deepspeed.utils.zero_to_fp32 import convert_zero_checkpoint_to_fp32_state_dict

SOURCE = next(p for p in DEEPSPEED if p.name == "1_2_fp32")


@pytest.mark.parametrize("size, words", [(0, "at least 1 byte"), (-1, "at least 1 byte"), (True, "not understood")])
def test_numbers_below_one_byte_and_bools_are_refused(size, words):
    assert parse_size(1) == 1 and parse_size(5 * 10**9) == 5 * 10**9 and parse_size("2KiB") == 2048  # still taken
    with pytest.raises(ValueError, match=words):
        parse_size(size)


@pytest.mark.parametrize("size", [0, -5])
def test_convert_with_a_shard_size_below_one_byte_writes_nothing(tmp_path, size):
    with pytest.raises(ValueError, match="at least 1 byte"):
        convert_zero_checkpoint_to_fp32_state_dict(SOURCE, tmp_path / "out", max_shard_size=size)
    assert list(tmp_path.iterdir()) == []
