"""A rank's host-memory peak is its own, whatever the size of the process that started it."""

from __future__ import annotations

import multiprocessing

import pytest

from zbench.host_memory import peak_rss_bytes, rss_bytes

pytestmark = pytest.mark.slow  # a spawned interpreter


def _report(queue) -> None:
    queue.put((peak_rss_bytes(), rss_bytes()))


def test_a_spawned_process_does_not_report_its_parents_peak():
    held = bytearray(400 << 20)  # touched: 400 MiB resident in this process
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_report, args=(queue,))
    child.start()
    peak, now = queue.get(timeout=120)
    child.join()
    assert len(held) and peak_rss_bytes() >= len(held)
    assert now <= peak < 200 << 20  # a bare interpreter; getrusage's ru_maxrss here would be over 400 MiB
