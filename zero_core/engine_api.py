"""The DeepSpeed engine calls that training scripts, Hugging Face Trainer and Lightning make, on zero_core's Engine.

Each reads what the engine already holds; those that read the device say so (a host sync). Calls that
DeepSpeed has and zero_core does not are refused by name (`zero_core.deepspeed`'s page lists them).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Iterator

import torch

from . import comm
from .engine_config_getters import ConfigGetters, wall_clock_on
from .engine_dataloader import EngineDataLoader
from .engine_exports import WeightExports
from .engine_queries import global_grad_norm
from .engine_torch_backward import TorchStyleBackward, close_stale_pass
from .no_sync_window import follow_no_sync_window
from .host_schedules import GroupLrs
from .model_export import settled
from .optim.facade import EngineScheduler, ZeroOptimizer


class DeepSpeedEngineAPI(WeightExports, TorchStyleBackward, EngineDataLoader, ConfigGetters):
    """Mixed into `zero_core.Engine`."""

    def train_batch_size(self) -> int:
        return int(self.config.train_batch_size)

    def train_micro_batch_size_per_gpu(self) -> int:
        return int(self.config.train_micro_batch_size_per_gpu)

    def gradient_accumulation_steps(self) -> int:
        return int(self.config.gradient_accumulation_steps)

    def is_gradient_accumulation_boundary(self) -> bool:
        """True when the next `step()` applies an update: at every `gradient_accumulation_steps`-th micro-step,
        or as `set_gradient_accumulation_boundary` last said."""
        close_stale_pass(self)
        follow_no_sync_window(self)
        if self._boundary_set is not None:
            return self._boundary_set
        return (self.micro_steps + 1) % self.gradient_accumulation_steps() == 0

    def set_gradient_accumulation_boundary(self, is_boundary: bool) -> None:
        """DeepSpeed's manual accumulation: before each backward the caller says whether it ends the window, and
        calls `step()` once after the last one (Accelerate's DeepSpeed wrapper does so). It holds from then on."""
        self._boundary_set = bool(is_boundary)
        self.__dict__["_no_sync_window"] = False  # the caller decides the boundaries from now on

    def zero_optimization_stage(self) -> int:
        return self.stage

    @property
    def local_rank(self) -> int:
        """This process's rank on its node (the launcher's LOCAL_RANK; 0 without a launcher)."""
        return comm.local_rank()

    @property
    def global_rank(self) -> int:
        return self.rank

    @property
    def dp_world_size(self) -> int:
        """Data-parallel ranks: all of them (zero_core has no model parallelism)."""
        return self.world_size

    def fp16_enabled(self) -> bool:
        return self.dtype == torch.float16

    def bfloat16_enabled(self) -> bool:
        return self.dtype == torch.bfloat16

    def gradient_clipping(self) -> float:
        return float(self.config.gradient_clipping)

    @property
    def communication_data_type(self) -> torch.dtype:
        return self.config.comm_dtype

    def steps_per_print(self) -> int | None:
        return self.config.steps_per_print

    def wall_clock_breakdown(self) -> bool:
        return wall_clock_on(self.config)  # also on with flops_profiler, as DeepSpeed's

    def get_batch_info(self) -> tuple[int, int, int]:
        """(train batch size, micro batch per GPU, accumulation steps), as DeepSpeed returns them."""
        return self.train_batch_size(), self.train_micro_batch_size_per_gpu(), self.gradient_accumulation_steps()

    def destroy(self) -> None:
        """DeepSpeed's name for releasing the engine: `close()`."""
        self.close()

    def zero_optimization(self) -> bool:
        return self.stage > 0

    @property
    def global_steps(self) -> int:
        """Optimizer steps taken (skipped fp16 steps included, as DeepSpeed counts them)."""
        return self.global_step

    @property
    def global_samples(self) -> int:
        return self.global_step * self.train_batch_size()

    def get_lr(self) -> list[float]:
        """The lr of every group for the next update, as DeepSpeed reports it once its scheduler has stepped
        (a host sync)."""
        if self._lr_writes is not None:  # no schedule: the groups' lrs, the config's until the loop sets one
            return GroupLrs(self.client_optimizer).values(0)[0]
        if self.host_schedule is not None:
            return [float(x) for x in self.host_schedule.values(self.applied_steps())[0]]
        return self.optimizer.lr_at(self.optimizer.applied, torch.float64).tolist()  # DeepSpeed's Python floats

    def get_mom(self) -> list:
        """Each group's momentum as DeepSpeed reports it: SGD's `momentum`, else Adam's (beta1, beta2) as the next
        update uses them (OneCycle's momentum cycling moves beta1 and sets beta2 0.99)."""
        groups = self.client_optimizer.param_groups
        if not isinstance(self.client_optimizer, ZeroOptimizer):  # the caller's optimizer: its own groups' values
            key = "momentum" if type(self.client_optimizer).__name__ in ("SGD", "RMSprop") else "betas"
            return [g.get(key, 0.0) for g in groups]
        betas = self.host_schedule.values(self.applied_steps())[1] if self.host_schedule is not None else None
        return betas or [(h.beta1, h.beta2) for h in self.optimizer.groups]

    def dynamic_loss_scale(self) -> bool:
        """fp16 with a loss scale that adapts (the config's `fp16.loss_scale` 0)."""
        return bool(self.scaler.dynamic)

    @property
    def mp_world_size(self) -> int:
        return 1  # no model parallelism

    @property
    def seq_dp_world_size(self) -> int:
        return self.world_size

    @property
    def data_parallel_group(self) -> Any:
        """Every rank's group (torch's default group; None in a single process without one)."""
        return torch.distributed.group.WORLD if torch.distributed.is_initialized() else None

    def empty_partition_cache(self) -> None:
        """Nothing is cached to release: stage 3 frees each gathered unit after its forward and its backward."""

    def get_global_grad_norm(self) -> Any:
        """The global gradient norm of the last step, before clipping: a 0-dim fp32 tensor on the CPU (a host sync);
        None before this engine's first step, and at stage 0 in fp32 (DeepSpeed's torch optimizer keeps none)."""
        return global_grad_norm(self)

    def was_step_applied(self) -> bool:
        """Whether the last step() changed the weights: an accumulation boundary's, not skipped for non-finite
        gradients (a host sync); False before any step, as DeepSpeed's."""
        return self.last_step_updated and int(self.optimizer.overflow.item()) == 0

    def zero_grad(self) -> None:
        """Nothing to do: gradients are released as they are reduced."""

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """DeepSpeed's (and DDP's) accumulation without reducing: a backward inside adds its gradients to those of
        the backwards after it, up to the one that ends the window, which reduces them all (DeepSpeed's stages 2-3
        refuse it; here every stage takes it). With boundaries set by `set_gradient_accumulation_boundary` (as
        Accelerate's loop sets them) those decide, as before the context."""
        if self.__dict__.get("_in_no_sync"):
            raise ValueError("engine.no_sync() is already open; enter it once per accumulated backward")
        before = None if self.__dict__.get("_no_sync_window") else self._boundary_set  # the count's, not a set one
        self._boundary_set, self.__dict__["_in_no_sync"] = False, True
        try:
            yield  # a backward here does not end the window: its gradients are kept for the next
        finally:
            self.__dict__["_in_no_sync"] = False
            self._boundary_set = before
            # the window now holds passes the micro-step count does not know of (no_sync_window.py)
            self.__dict__["_no_sync_window"] = before is None

    def get_data_types(self) -> tuple[torch.dtype, torch.dtype]:
        """(the model's dtype, the gradient accumulation dtype), as DeepSpeed's."""
        return self.dtype, self.config.grad_accum_dtype

    def save_checkpoint(self, save_dir: str | os.PathLike, tag: str | None = None,
                        client_state: dict[str, Any] | None = None, save_latest: bool = True,
                        keep_last: int | None = None, async_save: bool | None = None,
                        exclude_frozen_parameters: bool = False) -> Path | bool:
        """Collective: every rank writes its own partition; committed atomically; `latest` moves last
        (unless `save_latest=False`). `client_state` (plain data, Namespaces, tensors, numpy values, tuples:
        client_state_codec.py) comes back from `load_checkpoint` with its types. `keep_last=k` deletes this
        engine's own older checkpoints, never another's.
        `async_save` (default: the config's zero_core.async_checkpoint): return once the state is copied to
        host buffers; the write and commit go on in the background (`wait_for_checkpoint()`).
        `exclude_frozen_parameters=True` leaves the frozen parameters out, as DeepSpeed's (a LoRA run's base
        weights): a load keeps the model's own values for them. Returns the checkpoint's folder; True on engines
        of `deepspeed.initialize`, as DeepSpeed's."""
        from .checkpointing import save

        tag = None if tag is None else str(tag)  # as DeepSpeed: save_checkpoint(dir, tag=epoch)
        settled(self)  # the states as of the last step
        if async_save is None:
            async_save = self.config.zero_core.async_checkpoint
        folder = save(self, save_dir, tag, client_state, keep_last, move_latest=save_latest,
                      async_save=bool(async_save), exclude_frozen=exclude_frozen_parameters)
        return True if self.deepspeed_checkpoints else folder  # DeepSpeed's save_checkpoint returns True

    def wait_for_checkpoint(self) -> Path | None:
        """Collective: wait for the async save in flight to be committed; its folder (None if there was none).
        Raises the save's one-line CheckpointError if it failed (the previous checkpoint is then untouched)."""
        from .checkpoint_async import saver_of

        return saver_of(self).wait()

    def load_checkpoint(self, load_dir: str | os.PathLike, tag: str | None = None, load_module_strict: bool = True,
                        load_optimizer_states: bool = True, load_lr_scheduler_states: bool = True,
                        load_module_only: bool = False, custom_load_fn: Any = None
                        ) -> tuple[str, dict[str, Any]] | tuple[None, None]:
        """Collective: load any zbench checkpoint (any world size, any stage) into this engine; returns (a str path,
        client_state), the path as DeepSpeed's names its model-states file (os.path.join(load_dir, tag, file)): for a
        zbench checkpoint the rank file this rank's weights were read from (its own where the run saved as many),
        for a DeepSpeed one the model-states file DeepSpeed's load reads; (None, None) when `load_dir` holds no
        checkpoint and no tag is given (a first run's resume).
        client_state is the saved keys; from deepspeed.initialize's engines it is DeepSpeed's: its own entries the
        load did not take (buffer_names, param_shapes, global_samples, ds_config, ...; checkpoint_client_state.py),
        then the saved keys.
        `load_optimizer_states=False` keeps this engine's optimizer states but takes the run's step counters, as
        DeepSpeed does; `load_module_only` keeps the counters and the schedule too. `micro_steps` is never loaded,
        as in DeepSpeed. The next update takes the lrs the loaded optimizer's groups held. `load_module_strict=False`
        lets the model and the checkpoint differ in entries for a load of the weights alone
        (checkpoint_non_strict.py)."""
        from .checkpoint_client_state import LoadFlags
        from .checkpoint_load import nothing_to_resume
        from .checkpointing import load

        if custom_load_fn is not None:
            self._refuse("load_checkpoint(custom_load_fn=...)", "zbench's reader loads every checkpoint it accepts")
        tag = None if tag is None else str(tag)  # DeepSpeed's tags may be numbers: tag=epoch
        if tag is None and nothing_to_resume(load_dir):
            if self.rank == 0:
                print(f"zero_core: no checkpoint to load in {load_dir} (no 'latest' file); starting from the "
                      "current weights, load_checkpoint returns (None, None) as DeepSpeed's does", flush=True)
            return None, None
        settled(self)  # a delayed update must not write the states while they are loaded
        self.wait_for_checkpoint()
        weights_only = load_module_only or not load_optimizer_states
        schedule = load_lr_scheduler_states and not load_module_only
        applied, lrs = self.applied_steps(), self.get_lr() if isinstance(self.lr_scheduler, EngineScheduler) else None
        flags = LoadFlags(load_optimizer_states, load_lr_scheduler_states, load_module_only,
                          self.deepspeed_checkpoints, load_module_strict)
        # the micro-step count stays this engine's, as DeepSpeed's load leaves it: a checkpoint holds no gradients of
        # a window left open, so a new engine starts a whole window and a running one goes on with its own
        micro_steps = self.micro_steps
        try:
            path, client_state = load(self, load_dir, tag, weights_only=weights_only, schedule=schedule,
                                      counters=not load_module_only, flags=flags)
        finally:
            self.micro_steps = micro_steps
        # without its states this optimizer's applied count goes on, whatever step the run had reached
        self.steps_not_applied = self.global_step - applied if weights_only else 0
        if isinstance(self.lr_scheduler, EngineScheduler):
            self.lr_scheduler.after_load(schedule, not weights_only, applied, lrs)
        return path, client_state

    def _refuse(self, call: str, instead: str) -> None:
        raise NotImplementedError(f"engine.{call} is not supported by zero_core; {instead}")

    def set_train_batch_size(self, *_: Any) -> None:
        self._refuse("set_train_batch_size()", "set the batch sizes in the config")

    def set_train_micro_batch_size(self, *_: Any) -> None:
        self._refuse("set_train_micro_batch_size()", "set the batch sizes in the config")

    def train_batch(self, *_: Any, **__: Any) -> None:
        self._refuse("train_batch() (pipeline parallelism)", "call forward, backward and step")

    def eval_batch(self, *_: Any, **__: Any) -> None:
        self._refuse("eval_batch() (pipeline parallelism)", "call the engine's forward under torch.no_grad()")
