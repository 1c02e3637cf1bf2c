"""A DeepSpeed optimizer-states file whose `partition_count` names another number of ranks than the checkpoint's
rank files (a file from a save on another world size, or an edited one) is refused in one line, as DeepSpeed's
own zero_to_fp32 refuses it ("Expected 5 of '*_optim_states.pt' ... but found 2 files"), instead of converting."""

from __future__ import annotations

import pytest

from checkpoints.deepspeed_source import DeepSpeedSource
from deepspeed_crafting import crafted, patch, refuses

OPTIM = "zero_pp_rank_1_mp_rank_00_optim_states.pt"


@pytest.mark.parametrize("fixture", ["2_2_fp32", "3_2_fp32"])  # ZeRO-2 (a count per group), ZeRO-3 (one count)
@pytest.mark.parametrize("count, words", [(5, "says the save had 5 ranks, but the checkpoint has 2 rank files"),
                                          (1, "says the save had 1 ranks"),
                                          (0, "partition_count is 0, not an integer in [1, 1048576]")])
def test_a_partition_count_other_than_the_rank_files_is_refused(tmp_path, fixture, count, words):
    tag = crafted(tmp_path, fixture)
    assert DeepSpeedSource(tag).world_size == 2  # as saved: it opens
    patch(tag / OPTIM, "partition_count", count)
    refuses(tag, OPTIM, words)
