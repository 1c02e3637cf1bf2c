"""Large pinned buffers are locked at their exact size by the CUDA driver and unlocked when their memory goes
(a fake driver stands in for CUDA on the CPU)."""

from __future__ import annotations

import gc

import torch

from zero_core import pinned


class FakeCudart:
    def __init__(self, answer: int = 0) -> None:
        self.answer, self.registered, self.unregistered = answer, [], []

    def cudaHostRegister(self, ptr: int, nbytes: int, flags: int) -> int:
        self.registered.append((ptr, nbytes))
        return self.answer

    def cudaHostUnregister(self, ptr: int) -> int:
        self.unregistered.append(ptr)
        return 0


def test_large_buffer_is_registered_at_its_size_and_unregistered_with_its_memory(monkeypatch):
    fake = FakeCudart()
    monkeypatch.setattr(pinned.torch.cuda, "cudart", lambda: fake)
    numel = pinned.REGISTER_MIN_BYTES // 2 + 3  # bf16: just over the threshold, not a power of two
    t = pinned.empty_pinned(numel, torch.bfloat16)
    assert t.shape == (numel,) and fake.registered == [(t.data_ptr(), numel * 2)]
    ptr, view = t.data_ptr(), t[10:20]
    del t
    gc.collect()
    assert fake.unregistered == []  # a view still uses the memory: it stays locked
    del view
    gc.collect()
    assert fake.unregistered == [ptr]


def test_a_refused_registration_falls_back_to_torchs_pinned_allocator(monkeypatch):
    fake, asked = FakeCudart(answer=1), []
    monkeypatch.setattr(pinned.torch.cuda, "cudart", lambda: fake)
    real_empty = torch.empty

    def empty(*args, pin_memory=False, **kw):
        asked.append(pin_memory)
        return real_empty(*args, **kw)

    monkeypatch.setattr(pinned.torch, "empty", empty)
    t = pinned.empty_pinned((4, pinned.REGISTER_MIN_BYTES // 16), torch.float32)
    assert t.shape == (4, pinned.REGISTER_MIN_BYTES // 16) and asked == [False, True]
    assert len(fake.registered) == 1 and fake.unregistered == []


def test_a_refused_lock_in_place_says_which_share_and_what_to_do_and_leaves_nothing_locked(monkeypatch):
    """The driver locks the first tensor and refuses the second: the first is unlocked again and one error line
    names the size, CUDA's reason and the fix."""

    class RefusesSecond(FakeCudart):
        def cudaHostRegister(self, ptr: int, nbytes: int, flags: int) -> int:
            self.registered.append((ptr, nbytes))
            return 0 if len(self.registered) == 1 else 2

        def cudaGetErrorString(self, code: int) -> str:
            return "out of memory"

    fake = RefusesSecond()
    monkeypatch.setattr(pinned.torch.cuda, "cudart", lambda: fake)
    first, second = torch.zeros(1 << 18), torch.zeros(1 << 18)  # 1 MiB each
    try:
        pinned.lock_all([first, second], "lower the fraction")
        raise AssertionError("no error")
    except pinned.PageLockError as e:
        message = str(e)
    assert "\n" not in message and "CUDA error 2: out of memory" in message and "lower the fraction" in message
    assert "page-locking 1 MiB" in message and "locking 2 MiB in place" in message  # the one, then the share
    assert fake.unregistered == [first.data_ptr()]
    assert not pinned.is_locked(first) and not pinned.is_locked(second)
