"""Large offload buffers on 2 MiB pages (zero_core/host_pages.py): aligned, marked before first touch, zeroed by
comm.host_buffer, and ordinary buffers where the kernel offers no huge pages."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from zero_core import comm, host_pages

LARGE = host_pages.ADVISE_MIN_BYTES // 4 + 1000  # fp32 elements: just over the threshold, not whole pages


def _advised(monkeypatch) -> list[tuple[int, int, int]]:
    calls: list[tuple[int, int, int]] = []
    monkeypatch.setattr(host_pages, "_madvise", lambda addr, n, advice: calls.append((addr, n, advice)) or 0)
    return calls


def test_a_large_buffer_is_aligned_marked_for_huge_pages_and_zeroed(monkeypatch):
    calls = _advised(monkeypatch)
    buf = comm.host_buffer(LARGE, torch.float32, pin=False)
    assert buf.numel() == LARGE and buf.dtype == torch.float32 and buf.is_contiguous()
    assert buf.data_ptr() % host_pages.HUGE_PAGE == 0
    assert calls == [(buf.data_ptr(), LARGE * 4 // host_pages.HUGE_PAGE * host_pages.HUGE_PAGE, 14)]
    assert not buf.any()
    buf[-1] = 3.0  # the whole requested length is usable
    assert float(buf.sum()) == 3.0


def test_small_buffers_are_not_marked(monkeypatch):
    calls = _advised(monkeypatch)
    assert comm.host_buffer(1000, torch.bfloat16, pin=False).shape == (1000,)
    assert calls == []


@pytest.mark.parametrize("off", ["0", "off"])
def test_the_environment_can_leave_buffers_on_default_pages(monkeypatch, off):
    calls = _advised(monkeypatch)
    monkeypatch.setenv("ZERO_CORE_HUGE_PAGES", off)
    assert comm.host_buffer(LARGE, torch.float32, pin=False).numel() == LARGE
    assert calls == []


def test_without_madvise_the_buffer_is_an_ordinary_one(monkeypatch):
    monkeypatch.setattr(host_pages, "_madvise", None)
    buf = comm.host_buffer(LARGE, torch.bfloat16, pin=False)
    assert buf.numel() == LARGE and not buf.any()


def _mapping_kib(addr: int, field_name: str = "AnonHugePages") -> int:
    """A field of /proc/self/smaps for the mapping that holds `addr` (kB)."""
    lines = Path("/proc/self/smaps").read_text().splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
        if m and int(m.group(1), 16) <= addr < int(m.group(2), 16):
            for field in lines[i + 1 :]:
                if field.startswith(f"{field_name}:"):
                    return int(field.split()[1])
    raise AssertionError(f"no mapping holds {addr:#x}")


def _vm_flags(addr: int) -> list[str]:
    """The VmFlags of /proc/self/smaps for the mapping that holds `addr`."""
    lines = Path("/proc/self/smaps").read_text().splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
        if m and int(m.group(1), 16) <= addr < int(m.group(2), 16):
            return next(f.split()[1:] for f in lines[i + 1 :] if f.startswith("VmFlags:"))
    raise AssertionError(f"no mapping holds {addr:#x}")


def test_the_kernel_records_the_huge_page_advice_on_the_buffer():
    """The advice is on the mapping (smaps' `hg` flag). Whether 2 MiB pages then back it depends on the host's free
    contiguous memory at that moment, so the pages themselves are not asserted."""
    setting = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not setting.exists() or "[never]" in setting.read_text():
        pytest.skip("this kernel offers no transparent huge pages")
    buf = comm.host_buffer(LARGE, torch.float32, pin=False)
    assert "hg" in _vm_flags(buf.data_ptr())


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads the process's memory map")
def test_released_pages_leave_the_process_and_the_rest_of_the_buffer_is_kept():
    """The front half of a touched 128 MiB buffer goes back to the kernel (the mapping's resident size falls by
    it) and reads as zeros; the back half keeps its values."""
    numel = 32 << 20  # fp32: 128 MiB
    buf = comm.host_buffer(numel, torch.float32, pin=False)
    buf.fill_(2.5)
    before = _mapping_kib(buf.data_ptr(), "Rss")
    released = host_pages.release_pages(buf[: numel // 2])
    assert released >= (numel // 2) * 4 - 2 * host_pages.PAGE  # whole pages only: at most one partial page each end
    assert before - _mapping_kib(buf.data_ptr(), "Rss") >= released // 1024 - 4
    assert not buf[host_pages.PAGE : numel // 2 - host_pages.PAGE].any()
    assert bool((buf[numel // 2 :] == 2.5).all())


def test_nothing_is_released_without_madvise(monkeypatch):
    monkeypatch.setattr(host_pages, "_madvise", None)
    buf = torch.ones(1 << 20)
    assert host_pages.release_pages(buf) == 0 and bool((buf == 1).all())
