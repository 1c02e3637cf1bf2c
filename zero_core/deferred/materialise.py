"""Give a model built on the meta device its real initial values, one tensor at a time.

Two sources of those values:
- `RecordedInit`: the model was built inside `zero_core.init_context` (or `deepspeed.zero.Init`); its
  construction is replayed (replay.py) and the values are bitwise those of eager construction with the
  same seed, on any number of ranks. Every rank replays with rank 0's starting random state, as the eager
  path broadcasts rank 0's weights.
- `ModuleInit`: a model built on the meta device some other way (`torch.device("meta")`, `to_empty`
  style). Each module gets real tensors and its own `reset_parameters()` (or a Hugging Face model's
  `_init_weights`), in module order. The values are a valid initialisation, not eager construction's.

Either way `take_param(p, value)` receives each trainable or frozen parameter's full CPU value once (the
caller keeps its shard or the whole) and returns what `p` holds from then on (an empty placeholder, or the
whole value); buffers are placed on `device`, and nothing is held longer than it is needed. Parameters keep
their identity: `torch.utils.swap_tensors` gives each its contents, once the recording no longer holds views
of it (a view keeps a reference to its base, which the swap refuses, e.g. Hugging Face's in-place init of an
embedding's padding row).
"""

from __future__ import annotations

from typing import Callable

import torch

from .. import comm
from .record import Recording, storage_key
from .replay import Replay

_PENDING: list[Recording] = []  # constructions not yet materialised (meta tensors only: no memory)

TakeParam = Callable[[torch.nn.Parameter, torch.Tensor], torch.Tensor]


def remember(recording: Recording) -> None:
    _PENDING.append(recording)


def is_deferred(model: torch.nn.Module) -> bool:
    return any(t.device.type == "meta" for t in [*model.parameters(), *model.buffers()])


def _places(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, torch.Tensor, bool]]:
    """(module, attribute, tensor, is parameter) for every meta tensor the model holds under every name."""
    out = []
    for module in model.modules():
        for store, is_param in ((module._parameters, True), (module._buffers, False)):
            out += [
                (module, name, t, is_param) for name, t in store.items() if t is not None and t.device.type == "meta"
            ]
    return out


def placeholder(p: torch.nn.Parameter, value: torch.Tensor) -> None:
    """Give meta parameter `p` the contents `value` (any device and shape), keeping the object and its attributes
    (the swap exchanges them too: zero.Init's ds_numel and ds_shape, a model's own markers)."""
    kept = dict(p.__dict__)
    torch.utils.swap_tensors(p, torch.nn.Parameter(value, requires_grad=p.requires_grad))
    p.__dict__.update(kept)


class _Materialiser:
    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.model, self.device = model, device
        self.places = _places(model)

    def _give(self, places, view_of: Callable[[torch.Tensor], torch.Tensor], take_param: TakeParam,
              swaps: dict[int, tuple[torch.nn.Parameter, torch.Tensor]]) -> None:
        for module, name, t, is_param in places:
            if is_param:
                if id(t) not in swaps:  # a tied parameter once
                    swaps[id(t)] = (t, take_param(t, view_of(t)))
            else:
                module._buffers[name] = view_of(t).clone().to(self.device)


class RecordedInit(_Materialiser):
    def __init__(self, model: torch.nn.Module, recording: Recording, device: torch.device) -> None:
        super().__init__(model, device)
        self.recording = recording

    def run(self, take_param: TakeParam) -> None:
        rec = self.recording
        start = rec.rng_start.clone()
        comm.broadcast_(start, what="broadcast of the random state model construction began from")
        rec.rng_start = start
        _broadcast_reseeds(rec)
        by_key: dict[int, list] = {}
        for place in self.places:
            by_key.setdefault(storage_key(place[2]), []).append(place)
        replay = Replay(rec, set(by_key))
        swaps: dict[int, tuple[torch.nn.Parameter, torch.Tensor]] = {}

        def deliver(key: int, storage: torch.UntypedStorage) -> None:
            view = lambda m: torch.empty(0, dtype=m.dtype).set_(storage, m.storage_offset(), m.size(), m.stride())  # noqa: E731
            self._give(by_key.pop(key), view, take_param, swaps)

        untouched = torch.get_rng_state()
        replay.run(deliver)
        if by_key:
            names = sorted(name for places in by_key.values() for _, name, _, _ in places)
            raise RuntimeError(
                f"tensors {names[:5]} of the model were not created inside zero_core.init_context; "
                "build the whole model inside the context"
            )
        if torch.equal(untouched, rec.rng_end):  # nothing drawn since construction: go on as eager would
            torch.set_rng_state(replay.rng_after)
        _PENDING[:] = [r for r in _PENDING if r is not rec]
        self.peak_bytes = replay.peak_bytes
        rec.entries.clear()  # its views of the parameters would block the swaps; the recording is spent
        del replay
        for p, value in swaps.values():
            placeholder(p, value)


def _broadcast_reseeds(rec: Recording) -> None:
    """Every rank replays rank 0's seeds (set inside the context), as it replays rank 0's starting state."""
    reseeds = rec.reseeds()
    counts = comm.all_gather_object(len(reseeds), what="all-gather of the seeds set during model construction")
    if len(set(counts)) > 1:  # raised on every rank: no rank is left waiting in the broadcast below
        raise RuntimeError(f"model construction set the random seed {counts} times on ranks 0..{len(counts) - 1}; "
                           "build the model the same way on every rank")
    if reseeds:
        states = torch.stack([e.reseed for e in reseeds])
        comm.broadcast_(states, what="broadcast of the seeds set during model construction")
        for e, state in zip(reseeds, states):
            e.reseed = state.clone()  # a tensor of its own: the generator reads its storage from the start


class ModuleInit(_Materialiser):
    def run(self, take_param: TakeParam) -> None:
        start = torch.get_rng_state()
        comm.broadcast_(start, what="broadcast of the random state initialisation starts from")
        torch.set_rng_state(start)  # every rank draws rank 0's values
        init_weights = getattr(self.model, "_init_weights", None)
        for module in self.model.modules():
            own = [place for place in self.places if place[0] is module and place[2].device.type == "meta"]
            if not own:
                continue
            for _, name, t, is_param in own:
                if is_param:
                    placeholder(t, torch.empty(t.shape, dtype=t.dtype))
                else:
                    module._buffers[name] = torch.empty(t.shape, dtype=t.dtype)
            with torch.no_grad():
                if hasattr(module, "reset_parameters"):
                    module.reset_parameters()
                elif callable(init_weights):
                    init_weights(module)
            for _, name, t, is_param in own:
                if is_param:
                    placeholder(t, take_param(t, t.data))
                else:
                    module._buffers[name] = module._buffers[name].to(self.device)


def materialiser(model: torch.nn.Module, device: torch.device) -> RecordedInit | ModuleInit:
    """The source of `model`'s initial values (is_deferred(model) must hold)."""
    meta = next(t for t in [*model.parameters(), *model.buffers()] if t.device.type == "meta")
    key = storage_key(meta)
    for rec in reversed(_PENDING):
        if key in rec.known:
            return RecordedInit(model, rec, device)
    return ModuleInit(model, device)
