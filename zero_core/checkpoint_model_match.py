"""A checkpoint's entries against the model's, as `load_state_dict(strict=True)` holds them (or, for
`load_module_strict=False`, as its non-strict load does: checkpoint_non_strict.py), checked before a resume changes
anything: a zbench manifest's every entry, another tool's untrained ones (frozen parameters and persistent buffers).

DeepSpeed names its buffers (`buffer_names`) and frozen parameters; DCP saves every state-dict entry. An entry the
checkpoint holds that the model has no place for, a buffer of the model the checkpoint lacks, or an entry of another
shape would otherwise be dropped, left at its initial value, or fail half-way through the load; each is one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from checkpoints.source import CheckpointError, ParamInfo

from .checkpoint_non_strict import NameMatch, refuse_states

REFUSE = "load the checkpoint of this model"


def untrained_to_load(folder: Path, infos: dict[str, ParamInfo], trainable: set[str], state: dict[str, torch.Tensor],
                      trained: set[int], strict: bool = True) -> tuple[list[str], list[str], list[str]]:
    """(the checkpoint's frozen parameters and buffers to copy into the model, the model's untrained entries the
    checkpoint left out, the checkpoint's untrained entries the model does not keep). `state`: the model's
    state_dict(keep_vars=True); `trained`: ids of the parameters the engine trains. CheckpointError, naming the first
    entry, for an entry of another shape and, when `strict`, for an entry of the checkpoint the model does not keep
    or a buffer of the model the checkpoint lacks. Frozen parameters may be left out by design (DeepSpeed's
    save_checkpoint(exclude_frozen_parameters=True), DCP's ignore_frozen_params): they keep the model's values, which
    the caller reports."""
    saved = [n for n, i in infos.items() if n not in trainable and not i.tied_to]
    homeless = next((n for n in saved if n not in state), None)
    if homeless is not None and strict:
        raise CheckpointError(f"{folder} does not hold this model: it saved {homeless} {tuple(infos[homeless].shape)}, "
                              "which this model does not save (not a parameter or a persistent buffer of it); "
                              f"{REFUSE}, or give the model that entry")
    # tensors only: a module's `_extra_state` entry is whatever object it returns
    untrained = [n for n, t in state.items() if isinstance(t, torch.Tensor) and id(t) not in trained]
    lacking = [n for n in untrained if n not in infos]
    buffer = next((n for n in lacking if not isinstance(state[n], torch.nn.Parameter)), None)
    if buffer is not None and strict:
        raise CheckpointError(f"{folder} does not hold this model: its buffer {buffer} {tuple(state[buffer].shape)} "
                              f"is not in the checkpoint; {REFUSE}, or make that buffer non-persistent "
                              "(register_buffer(..., persistent=False)) if the model rebuilds it")
    for name in (n for n in untrained if n in infos):
        want, have = tuple(infos[name].shape), tuple(state[name].shape)
        if want != have:
            raise CheckpointError(f"{folder} does not hold this model: {name} is {want} in the checkpoint but {have} "
                                  f"in the model; {REFUSE}")
    kept = [n for n in saved if n in state]
    return [n for n in kept if id(state[n]) not in trained], lacking, [n for n in saved if n not in state]


def check_trained_have_states(folder: Path, names: list[str], trainable: set[str]) -> None:
    """Each parameter the engine trains was trained by the run (it has optimizer states to load), or one line."""
    frozen = next((n for n in names if n not in trainable), None)
    if frozen is not None:
        raise CheckpointError(f"{folder}: {frozen} is trained by this model but was frozen in the run that saved it "
                              "(it has no optimizer states); freeze it as that run did, or pass "
                              "load_optimizer_states=False to load the weights alone")


def report_kept(folder: Path, kept: list[str], rank: int) -> None:
    """Say on rank 0 which frozen parameters a save left out (they keep the model's values): by design in a save
    that excludes them, but never silent."""
    if kept and rank == 0:
        print(f"zero_core: {folder} holds no frozen parameter {', '.join(kept[:3])}{' ...' if len(kept) > 3 else ''}"
              " (saved without frozen parameters); they keep this model's values", flush=True)


def zbench_model_match(folder: Path, manifest: dict[str, Any], current: list[dict[str, Any]], strict: bool = True,
                       weights_only: bool = False) -> tuple[NameMatch, list[str]]:
    """A zbench manifest's entries against the model's `current` (checkpoint_load.param_entries): (the entries a
    non-strict load leaves out, the model's entries the save left out as frozen parameters). CheckpointError for
    another model (strict), a shared entry of another shape or training, or a left-out one trained now whose optimizer
    states the load would take."""
    saved = {p["name"]: p for p in manifest["params"]}
    excluded = set(manifest.get("excluded", []))
    kept = [e["name"] for e in current if e["name"] in excluded or e["tied_to"] in excluded]
    if not weights_only:
        check_trained_have_states(folder, [e["name"] for e in current if e["trainable"] and e["name"] in kept], set())
    found = NameMatch([e["name"] for e in current if e["name"] not in saved and e["name"] not in kept],
                      [n for n in saved if n not in {e["name"] for e in current}])
    if strict and found:
        raise CheckpointError(
            f"{folder} is from another model: missing {found.missing[:3]} unexpected {found.unexpected[:3]}; "
            "load a checkpoint of this model"
        )
    trained = NameMatch([e["name"] for e in current if e["trainable"] and e["name"] in found.missing],
                        [n for n in found.unexpected if saved[n]["trainable"]])
    refuse_states(folder, trained, weights_only)  # untrained entries hold no optimizer states
    for e in (e for e in current if e["name"] in saved):
        if list(saved[e["name"]]["shape"]) != e["shape"] or saved[e["name"]]["trainable"] != e["trainable"]:
            raise CheckpointError(
                f"{folder}: {e['name']} is {saved[e['name']]['shape']} in the checkpoint but {e['shape']} "
                "in the model; load a checkpoint of this model"
            )
    return found, kept
