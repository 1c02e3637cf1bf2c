"""The offload host thread runs jobs in order and surfaces failures on the training thread."""

from __future__ import annotations

import pytest

from zero_core.optim.host_folder import HostFolder


def test_jobs_run_in_order_and_wait_blocks():
    folder = HostFolder()
    seen: list[int] = []
    for i in range(50):
        folder.submit(None, lambda i=i: seen.append(i))
    folder.wait()
    assert seen == list(range(50))
    folder.close()


def test_failure_is_raised_by_wait_and_later_jobs_are_skipped():
    folder = HostFolder()
    seen: list[int] = []

    def bad() -> None:
        raise ValueError("disk on fire")

    folder.submit(None, bad)
    folder.submit(None, lambda: seen.append(1))
    with pytest.raises(RuntimeError, match="disk on fire"):
        folder.wait()
    assert seen == []
    folder.submit(None, lambda: seen.append(2))  # usable again after the error was reported
    folder.wait()
    assert seen == [2]
    folder.close()
