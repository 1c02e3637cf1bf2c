"""A DeepSpeed model-states file whose `buffer_names` lists a buffer its `module` holds no data for (a damaged or
hand-edited file) is refused in one line by `zbench inspect`, `zbench convert` and a resume, instead of the buffer
being left out of the output: ZeRO-1/2 and ZeRO-3 keep every persistent buffer whole in the module."""

from __future__ import annotations

import pytest
import torch

from checkpoints.deepspeed_pickle import load_pickle
from deepspeed_crafting import crafted, refuses
from helpers import read_command, refused

FILES = {"2_2_fp32": "mp_rank_00_model_states.pt", "3_2_fp32": "zero_pp_rank_0_mp_rank_00_model_states.pt"}


def _without_buffer_data(tmp_path, fixture: str):
    """A copy of `fixture` whose first model-states file still names `mix` in buffer_names but lost its data."""
    tag = crafted(tmp_path, fixture)
    path = tag / FILES[fixture]
    state = load_pickle(path, mmap=False)
    assert "mix" in state["buffer_names"]
    del state["module"]["mix"]
    torch.save(state, path)
    return tag


@pytest.mark.parametrize("fixture", list(FILES))
def test_a_listed_buffer_without_data_is_refused_by_the_reader(tmp_path, fixture):
    tag = _without_buffer_data(tmp_path, fixture)
    refuses(tag, FILES[fixture], "buffer 'mix' is listed in buffer_names but the module holds no data for it",
            "copy it again")


@pytest.mark.parametrize("command", ["inspect", "convert"])
def test_inspect_and_convert_say_so_in_one_line_and_write_nothing(tmp_path, command):
    tag = _without_buffer_data(tmp_path / "src", "2_2_fp32")
    line = refused(tmp_path, *read_command(command, tag.parent, tmp_path / "out"))
    assert "buffer 'mix' is listed in buffer_names" in line
    assert not (tmp_path / "out").exists()
