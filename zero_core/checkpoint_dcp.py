"""Resume a torch.distributed.checkpoint (DCP) folder in zero_core, as FSDP2 and Accelerate save one: the fp32 weights,
Adam's moments and the step count, on any number of ranks and at any stage.

The model's tensors come from the folder (checkpoints/dcp_source.py: under "model", "<app>.model", ... or at the top
level). Adam's `exp_avg`, `exp_avg_sq` and `step` come from the same folder (`optim.state.<fqn>.*`, as
`get_state_dict` names them, or `optimizer_0.state.<fqn>.*`, as Lightning's ModelParallelStrategy does) or, for an
Accelerate FSDP save, from `optimizer_0/` beside `pytorch_model_fsdp_0/`. Lightning's meta.pt (its loops, epoch and
step) comes back as the client_state, so a Lightning resume goes on from there.
The parameters with moments are the trained ones; the rest (frozen parameters, buffers) are copied as saved. Every
chunk file is checked before anything changes: present, whole, and its CRCs where DCP wrote a zip (its raw tensor
bytes carry none). Not carried over: the lr scheduler (a DCP save holds none; the config's schedule goes on from the
step count), the loss scale and the optimizer's hyper-parameters (the config's apply).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from checkpoints.dcp_source import DcpSource, is_dcp_folder
from checkpoints.deepspeed_pickle import load_pickle
from checkpoints.detect import MODEL_FOLDERS
from checkpoints.paths import inside
from checkpoints.source import CheckpointError, ParamInfo

from .checkpoint_deepspeed import load_foreign

if TYPE_CHECKING:
    from .engine import Engine

ACCELERATE_STATES = "optimizer_0"  # Accelerate's FSDP save: the optimizer's DCP folder beside the model's
LIGHTNING_META = "meta.pt"  # Lightning's ModelParallelStrategy: the checkpoint's other entries, beside the shards


class _SavedRun:
    """What a DCP save says of its run, in the form checkpoint_deepspeed.load_foreign reads."""

    def __init__(self, trainable: set[str], step: int | None, client_state: dict[str, Any]) -> None:
        self.trainable, self.step, self.skipped = trainable, step, 0
        self.lr_scheduler, self.client_state = None, client_state


class DcpRun:
    """A DCP checkpoint as a resume reads it: weights from one folder, optimizer states from it or beside it."""

    def __init__(self, folder: Path, trainable: set[str]) -> None:
        """`trainable`: the engine's trained parameter names (the trained ones of a save without moments)."""
        self.weights = DcpSource(folder)
        beside = folder.parent / ACCELERATE_STATES
        split = folder.name in MODEL_FOLDERS and os.path.lexists(beside)
        if split:  # as detect.py takes the model's folder: a real folder inside the save, not a link elsewhere
            beside = inside(folder.parent, ACCELERATE_STATES, what="optimizer folder")
            split = is_dcp_folder(beside)
        self.states = DcpSource(beside, states_only=True) if split else self.weights
        moments = self.states.states()
        names = {i.name for i in self.weights.params()}
        self.model = _SavedRun(set(moments) if moments else names & trainable,
                               self.states.saved_step() if moments else None, lightning_extras(folder))

    def params(self) -> list[ParamInfo]:
        return self.weights.params()

    def load(self, name: str) -> Any:
        return self.weights.load(name)

    def load_state(self, name: str, key: str) -> Any:
        return self.states.load_state(name, key)

    def check_states(self, keys: tuple[str, ...]) -> None:
        self.states.check_states(sorted(self.model.trainable), keys)

    def verify(self) -> list[str]:
        """Bad chunk files of the weights' folder and, when apart, of the states' folder."""
        return self.weights.verify() + (self.states.verify() if self.states is not self.weights else [])

    def read_problems(self) -> list[str]:
        return []  # every chunk was checked before the load (verify)

    def loss_scaler(self) -> None:
        return None  # a DCP save of torch's optimizer holds none


def lightning_extras(folder: Path) -> dict[str, Any]:
    """The entries Lightning's ModelParallelStrategy keeps beside the shards in meta.pt (epoch, global_step, the
    loops' progress, callbacks), which a Lightning resume restores; {} without one. Read as plain data by torch's
    weights-only unpickler: nothing from the file is imported or run, and anything else is refused in one line."""
    if not os.path.lexists(folder / LIGHTNING_META):
        return {}
    meta = load_pickle(inside(folder, LIGHTNING_META, what="Lightning's metadata file"))
    if not isinstance(meta, dict):
        raise CheckpointError(f"{folder / LIGHTNING_META} holds {type(meta).__name__}, not Lightning's checkpoint "
                              "entries; remove it or use the folder Lightning wrote")
    return meta


def load_dcp(engine: "Engine", folder: Path, weights_only: bool, schedule: bool,
             counters: bool = False, strict: bool = True) -> tuple[Path, dict[str, Any]]:
    """Collective (each rank reads its own fragments). Returns (the folder, Lightning's entries of meta.pt, or {}: a
    DCP save holds no client_state otherwise)."""
    run = DcpRun(folder, {slot.name for slot in engine.layout.slots})
    model = engine.module
    ours = {n for n, _ in model.named_parameters(remove_duplicate=False)} | {n for n, _ in model.named_buffers()}
    extra = next((i.name for i in run.params() if i.name not in ours), None)
    if extra is not None and strict:  # a DCP save lists every tensor of its model: each must have a home in this one
        raise CheckpointError(f"{folder} does not hold this model: it has {extra}, which this model does not; "
                              "load the checkpoint of this model")
    problems = run.verify()
    if problems:
        raise CheckpointError(f"{problems[0]}; nothing was loaded: copy the checkpoint again")
    return load_foreign(engine, folder, run, weights_only, schedule, counters, strict=strict)
