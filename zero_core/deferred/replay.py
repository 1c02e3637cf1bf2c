"""Compute a recorded construction (record.py) on the CPU, holding only what is still to be read.

Each storage's life is cut into versions: a version starts where the storage is created or an
operation sets all of it without reading it (a random fill, `zero_`, `fill_`, `copy_`), and ends at
the last operation touching it before the next such start. A version is allocated when it starts and
freed when it ends, so a weight that `__init__` fills and a later `apply(init_fn)` fills again is never
held across the two. The last version of each model tensor is handed to `deliver` as it ends, then freed
(the caller keeps what it needs: this rank's shard, or a replicated buffer).

Every operation runs, in the recorded order, on the CPU generator set to the state construction began
from, and set again wherever construction set a seed: the random stream is the one eager construction drew.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten, tree_map

from .record import Recording, is_meta, storage_key

CPU = torch.device("cpu")


def _plan(rec: Recording, final: set[int]) -> tuple[dict[int, list[int]], set[tuple[int, int]]]:
    """(entry index -> storages whose version ends there, {(entry index, storage)}: final versions' ends)."""
    last_touch: dict[int, int] = {}
    ends: dict[int, list[int]] = defaultdict(list)
    for i, e in enumerate(rec.entries):
        for key in dict.fromkeys(e.fresh + e.writes + e.reads):
            starts = key in e.fresh or (e.overwrites and key == e.writes[0])
            if starts and key in last_touch:
                ends[last_touch[key]].append(key)  # the previous version ends at its last touch
            last_touch[key] = i
    final_ends = set()
    for key, i in last_touch.items():
        ends[i].append(key)
        if key in final:
            final_ends.add((i, key))
    return ends, final_ends


def _device_to_cpu(x: Any) -> Any:
    if isinstance(x, torch.device) and x.type == "meta":
        return CPU
    if isinstance(x, str) and x == "meta":
        return "cpu"
    return x


class Replay:
    def __init__(self, rec: Recording, final: set[int]) -> None:
        self.rec, self.final = rec, final
        self.ends, self.final_ends = _plan(rec, final)
        self.live: dict[int, torch.UntypedStorage] = {}
        self.peak_bytes = self.live_bytes = 0  # what replay held at once (diagnostics and tests)

    def view(self, m: torch.Tensor) -> torch.Tensor:
        """The real tensor behind meta tensor `m`, as a view of its storage's live version."""
        key = storage_key(m)
        if key not in self.live:
            raise RuntimeError("a meta tensor read during model construction was not created inside "
                               "zero_core.init_context; build the whole model inside the context")
        return torch.empty(0, dtype=m.dtype).set_(self.live[key], m.storage_offset(), m.size(), m.stride())

    def _hold(self, key: int, storage: torch.UntypedStorage) -> None:
        self.live[key] = storage
        self.live_bytes += storage.nbytes()
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def _drop(self, key: int) -> None:
        storage = self.live.pop(key, None)
        if storage is not None:
            self.live_bytes -= storage.nbytes()

    def _adopt(self, meta_out: torch.Tensor, real: torch.Tensor) -> None:
        key = storage_key(meta_out)
        nbytes = meta_out.untyped_storage().nbytes()
        if (real.untyped_storage().nbytes() == nbytes and real.storage_offset() == meta_out.storage_offset()
                and real.stride() == meta_out.stride()):
            self._hold(key, real.untyped_storage())
            return
        self._hold(key, torch.UntypedStorage(nbytes))
        self.view(meta_out).copy_(real)

    def run(self, deliver: Callable[[int, torch.UntypedStorage], None]) -> None:
        """Replay every operation; `deliver(storage key, storage)` at the end of each final version."""
        saved = torch.get_rng_state()
        torch.set_rng_state(self.rec.rng_start)
        try:
            with torch.no_grad():
                for i, e in enumerate(self.rec.entries):
                    if e.reseed is not None:  # construction set a seed here: eager drew from it on
                        torch.set_rng_state(e.reseed)
                    if e.overwrites:  # a fresh version of the storage it fills
                        self._drop(e.writes[0])
                        self._hold(e.writes[0], torch.UntypedStorage(e.args[0].untyped_storage().nbytes()))
                    real = lambda x: self.view(x) if is_meta(x) else _device_to_cpu(x)  # noqa: E731
                    result = e.func(*tree_map(real, e.args), **tree_map(real, e.kwargs))
                    if e.fresh:
                        metas, reals = tree_flatten(e.out)[0], tree_flatten(result)[0]
                        for m, r in zip(metas, reals):
                            if is_meta(m) and storage_key(m) in e.fresh and storage_key(m) not in self.live:
                                self._adopt(m, r)
                    for key in self.ends.get(i, ()):
                        if (i, key) in self.final_ends:
                            deliver(key, self.live[key])
                        self._drop(key)
            self.rng_after = torch.get_rng_state()
        finally:
            torch.set_rng_state(saved)
