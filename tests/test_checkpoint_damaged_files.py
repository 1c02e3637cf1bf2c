"""DeepSpeed rank files damaged in ways torch reports oddly: a zip cut short (EINVAL from torch's reader) is named
truncated, and a plain pickle (with torch's warnings about it) is one line and never run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from checkpoint_helpers import DEEPSPEED
from checkpoints.deepspeed_pickle import load_pickle
from checkpoints.source import CheckpointError


@pytest.mark.parametrize("cut", ["one byte", "half"])
def test_a_cut_rank_file_is_named_truncated_not_unreadable(tmp_path, cut):
    """torch reports a zip cut short as EINVAL: that is damage to copy again, not a permission to check."""
    folder = tmp_path / "ck"
    shutil.copytree(next(p for p in DEEPSPEED if p.name == "2_2_fp32"), folder)
    path = next(folder.glob("global_step*/zero_pp_rank_1_mp_rank_00_optim_states.pt"))
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size - 1 if cut == "one byte" else size // 2)
    with pytest.raises(CheckpointError) as e:
        load_pickle(path)
    assert "is truncated or corrupt" in str(e.value) and "readable" not in str(e.value)


def test_a_plain_pickle_as_a_rank_file_is_one_line_and_never_run(tmp_path):
    import pickle
    import warnings

    path = tmp_path / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    marker = tmp_path / "ran"
    path.write_bytes(pickle.dumps(_Runs(str(marker)), protocol=4))
    with warnings.catch_warnings(record=True) as seen, pytest.raises(CheckpointError):
        warnings.simplefilter("always")
        load_pickle(path)
    assert not marker.exists() and not seen  # torch's warning lines would come before the one-line error


class _Runs:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))
