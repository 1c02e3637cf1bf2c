"""An async save on a disk that fills on one rank fails at once in one line naming that rank's problem, instead of
rank 0 waiting out its timeout for a marker the full disk refused; the previous checkpoint stays as it was."""

from __future__ import annotations

import re

import pytest
from async_disk_full_workers import disk_full_on_rank_1_async
from dist_harness import run_ranks

pytestmark = pytest.mark.slow  # spawned ranks: outside the fast tier (-m 'not slow')


def test_disk_full_on_one_rank_during_an_async_save_names_that_rank(tmp_path):
    got = run_ranks(disk_full_on_rank_1_async, 2, str(tmp_path))
    msg = got["message"]
    assert msg is not None and "\n" not in msg
    assert re.search(r"rank 1 could not write \S+rank_00001\.safetensors \(no space left on the device\); "
                     "free space on that disk", msg), msg
    assert msg.endswith("the previous checkpoint (global_step2) and 'latest' are unchanged")
    assert got["listing"] == ["global_step2", "latest"]
