"""An async save that rank 0 gives up on (its wait for a rank ran out, or a rank failed) deletes no file a slower
rank is still writing: the staging folder is marked abandoned, each rank deletes its own files once done, and the
folder goes once every rank has left its marker (at once if they all have, else at the next save)."""

from __future__ import annotations

import pytest
from async_abandon_workers import rank_0_gives_up_while_rank_1_writes
from dist_harness import run_ranks

pytestmark = pytest.mark.slow  # spawned ranks: outside the fast tier (-m 'not slow')

WORDS = {
    "timeout": "rank 1 did not finish writing its files within 1 s",
    "rank 0 fails": "rank 0 could not write",
}


@pytest.mark.parametrize("case", list(WORDS))
def test_rank_0_giving_up_leaves_a_slower_ranks_file_alone(tmp_path, case):
    got = run_ranks(rank_0_gives_up_while_rank_1_writes, 2, str(tmp_path), case)
    assert got["message"] is not None and WORDS[case] in got["message"] and "\n" not in got["message"]
    assert got["message"].endswith("the previous checkpoint (global_step2) and 'latest' are unchanged")
    assert got["rank 1"] == {"file kept while written": True}
    assert all(name.startswith(".") for name in got["inside"]), got["inside"]  # markers only: each rank's files gone
    if case == "rank 0 fails":  # rank 1 finished before rank 0 gave up its wait: the folder went at once
        assert got["left"] == ["global_step2", "latest"]
    assert got["after"] == ["global_step2", "latest", "next"]  # the next save removed what was left
