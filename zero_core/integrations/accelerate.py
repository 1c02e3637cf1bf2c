"""Accelerate scripts written for `distributed_type: DEEPSPEED` on zero_core: one changed import.

    from zero_core.integrations.accelerate import Accelerator      # was: from accelerate import Accelerator
    accelerator = Accelerator()                  # the DeepSpeed settings `accelerate launch` exported, or
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config="ds_config.json"))  # or zero_config=
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    loss = model(**batch).loss; accelerator.backward(loss); optimizer.step(); scheduler.step(); optimizer.zero_grad()

The DeepSpeed plugin is read for its config and never handed to Accelerate, which runs as plain multi-process
data parallel (so DeepSpeed need not be installed); `accelerator.state.deepspeed_plugin` still answers it
(accelerate_state.py). `prepare` builds zero_core's engine from the model, the
optimizer (or `DummyOptim` with the config's optimizer) and the scheduler (or `DummyScheduler`); `backward`
runs the engine's backward and, at Accelerate's `sync_gradients`, its step, as Accelerate's DeepSpeed path does,
so the loop's `optimizer.step()` and `zero_grad()` do nothing (schedulers: accelerate_schedules.py).
Dataloaders are Accelerate's. `save_state`/`load_state`
write and read zbench checkpoints (any world size or stage), with the JSON states of the objects registered for
checkpointing (accelerate_registered.py) and `accelerator.step` (accumulate()'s place in its window, which
Accelerate saves too); `get_state_dict` gathers the full weights.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Iterator

import accelerate
import torch
from accelerate.utils import DeepSpeedPlugin
from accelerate.utils.deepspeed import DummyOptim, DummyScheduler  # not re-exported without DeepSpeed

from ..config import read_config_file
from ..config_auto import AutoValues, is_auto
from ..engine import Engine
from .accelerate_config import (
    check_against_config,
    dummy_values,
    fill_auto_only,
    plugin_config,
    with_mixed_precision,
)
from .accelerate_folders import load_folder, save_folder, saved
from .accelerate_registered import REGISTERED, registered_states, restore_registered
from .accelerate_schedules import engine_scheduler, is_deepspeed_schedule, prepared_schedule
from .accelerate_state import report_plugin
from .handles import EngineOptimizer, hidden_size

ACCUMULATION_STEP = "accelerate_step"  # the client_state key of Accelerator.step


def _launched_on_host_only(kwargs: dict[str, Any]) -> bool:
    """A launched process (torchrun, `accelerate launch`) on a machine with no accelerator, `cpu` not given.

    Accelerate's DeepSpeed path runs such a process group as DEEPSPEED, where `gather`, `reduce` and
    `gather_for_metrics` collect from every process; as plain data parallel Accelerate would call it NO (one
    process: each rank's metrics its own) or start no process group at all, unless it is told `cpu=True`."""
    if "cpu" in kwargs or int(os.environ.get("LOCAL_RANK", -1)) == -1:
        return False
    found = getattr(torch, "accelerator", None)
    return not (found.is_available() if found is not None else torch.cuda.is_available())


class Accelerator(accelerate.Accelerator):
    """accelerate.Accelerator whose prepared model is zero_core's engine, from a DeepSpeed config."""

    def __init__(
        self,
        *args: Any,
        zero_config: str | os.PathLike | dict | None = None,
        deepspeed_plugin: DeepSpeedPlugin | None = None,
        **kwargs: Any,
    ) -> None:
        if deepspeed_plugin is None and zero_config is None and os.environ.get("ACCELERATE_USE_DEEPSPEED") == "true":
            deepspeed_plugin = DeepSpeedPlugin()  # what `accelerate launch` exported for a DEEPSPEED config
        if isinstance(deepspeed_plugin, dict):
            raise ValueError("zero_core's Accelerator trains one model; pass one DeepSpeedPlugin or zero_config=")
        if zero_config is None and deepspeed_plugin is None:
            raise ValueError(
                "zero_core's Accelerator needs a DeepSpeed config: zero_config='ds_config.json', "
                "deepspeed_plugin=DeepSpeedPlugin(...), or `accelerate launch` with a DEEPSPEED config"
            )
        if zero_config is not None:
            self.zero_config = (
                read_config_file(os.fspath(zero_config))
                if isinstance(zero_config, (str, os.PathLike))
                else dict(zero_config)
            )
        else:
            self.zero_config = plugin_config(deepspeed_plugin)
        gas = self.zero_config.get("gradient_accumulation_steps")
        if (
            isinstance(gas, int)
            and "gradient_accumulation_steps" not in kwargs
            and "gradient_accumulation_plugin" not in kwargs
        ):
            kwargs["gradient_accumulation_steps"] = (
                gas  # Accelerate's sync_gradients follows the config, as with DeepSpeed
            )
        if _launched_on_host_only(kwargs):
            kwargs["cpu"] = True  # MULTI_CPU: the processes are one group, as DeepSpeed's on the host
        use_deepspeed = os.environ.pop("ACCELERATE_USE_DEEPSPEED", None)  # Accelerate must not start DeepSpeed
        try:
            super().__init__(*args, **kwargs)
        finally:
            if use_deepspeed is not None:
                os.environ["ACCELERATE_USE_DEEPSPEED"] = use_deepspeed
        self.zero_config = with_mixed_precision(self.zero_config, self.mixed_precision)
        if deepspeed_plugin is not None:  # scripts read it to choose DummyOptim / DummyScheduler
            report_plugin(self.state, deepspeed_plugin)
        self.engine: Engine | None = None
        self._told_clipping = False

    def _on_engine(self, obj: Any) -> bool:
        """The optimizer `prepare` returned, or a scheduler built on it afterwards: as Accelerate's DeepSpeed path
        returns those from a later prepare(), this one hands them back as they are (the loop steps such a scheduler
        once per call, and the engine takes the lrs it writes)."""
        handle = getattr(self, "_zero_optimizer", None)
        return handle is not None and (obj is handle or getattr(obj, "optimizer", None) is handle)

    def prepare(self, *objects: Any, device_placement: list[bool] | None = None) -> Any:
        models = [o for o in objects if isinstance(o, torch.nn.Module)]
        if len(models) > 1 or (self.engine is not None and models):
            raise ValueError("zero_core's Accelerator trains one model, prepared once; pass it to one prepare() call")
        if not models and any(self._on_engine(o) for o in objects):
            out = [o if self._on_engine(o) else self.prepare(o) for o in objects]
            return tuple(out) if len(out) > 1 else out[0]
        optimizers = [o for o in objects if isinstance(o, (torch.optim.Optimizer, DummyOptim))]
        torch_or_dummy = (torch.optim.lr_scheduler.LRScheduler, DummyScheduler)
        schedulers = [o for o in objects if isinstance(o, torch_or_dummy) or is_deepspeed_schedule(o)]
        if (optimizers or schedulers) and not models:  # the engine was built (or will be) without them
            raise ValueError(
                "zero_core's Accelerator builds the engine at the prepare() call that gets the model; pass the "
                "model, optimizer (and scheduler, dataloader) in one prepare() call"
            )
        if not models:
            return super().prepare(*objects, device_placement=device_placement)
        if len(optimizers) > 1 or len(schedulers) > 1:
            raise ValueError("zero_core's Accelerator takes one optimizer and at most one scheduler")
        check_against_config(self.zero_config, optimizers[0] if optimizers else None,
                             schedulers[0] if schedulers else None)
        loaders = [o for o in objects if isinstance(o, torch.utils.data.DataLoader)]
        handle = self._build(
            models[0],
            optimizers[0] if optimizers else None,
            schedulers[0] if schedulers else None,
            loaders[0].batch_size if loaders else None,
        )
        out = []
        for o in objects:
            if o is models[0]:
                out.append(self.engine)
            elif optimizers and o is optimizers[0]:
                out.append(handle)
            elif schedulers and o is schedulers[0]:
                out.append(prepared_schedule(self.engine, handle, isinstance(o, DummyScheduler),
                                              self.gradient_state))
            else:  # dataloaders and the rest: Accelerate's
                out.append(super().prepare(o))
        return tuple(out) if len(out) > 1 else out[0]

    def _build(self, model: torch.nn.Module, optimizer: Any, scheduler: Any, micro: int | None) -> EngineOptimizer:
        raw = json.loads(json.dumps(self.zero_config))  # filled below: the plugin's own config stays as given
        fill_auto_only(raw, dummy_values(optimizer, scheduler, self.num_processes, self.split_batches))
        groups = None
        if isinstance(optimizer, DummyOptim):
            groups, optimizer = list(optimizer.params), None
        if isinstance(scheduler, DummyScheduler):
            scheduler = scheduler.lr_scheduler_callable  # None: the config's scheduler
        scheduler = engine_scheduler(scheduler, self.num_processes, self.split_batches,
                                     self.step_scheduler_with_optimizer)
        lr = optimizer.param_groups[0]["lr"] if isinstance(optimizer, torch.optim.Optimizer) else None
        for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
            raw.setdefault(key, "auto")
        gas = raw["gradient_accumulation_steps"]
        if isinstance(gas, int) and not isinstance(gas, bool) and gas > 0:
            self.gradient_accumulation_steps = gas  # as Accelerate's DeepSpeed path: the config's value wins
        # Accelerate fills "auto" only and keeps an explicit value (must_match=False): the micro-batch is compared
        # only where it is "auto", and the precision was settled by with_mixed_precision
        auto = AutoValues(
            world_size=self.num_processes,
            per_device_train_batch_size=micro if is_auto(raw["train_micro_batch_size_per_gpu"]) else None,
            gradient_accumulation_steps=self.gradient_accumulation_steps,
            learning_rate=lr,
            hidden_size=hidden_size(model),
        )
        if micro is None and is_auto(raw["train_micro_batch_size_per_gpu"]) and not isinstance(
            raw.get("train_batch_size"), int
        ):  # the engine would ask for Trainer's per_device_train_batch_size
            raise ValueError(
                "the DeepSpeed config's train_micro_batch_size_per_gpu is 'auto' and this prepare() call has no "
                "dataloader to take it from; pass the training dataloader to the same prepare() call as the model, "
                "or set train_micro_batch_size_per_gpu"
            )
        self.engine = Engine(
            model, raw, model_parameters=groups, optimizer=optimizer, lr_scheduler=scheduler, auto=auto
        )
        self._zero_optimizer = EngineOptimizer(self.engine)
        return self._zero_optimizer

    # -- the loop's calls ---------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        if self.engine is None:
            return super().backward(loss, **kwargs)
        # as DeepSpeedEngineWrapper: Accelerate's sync_gradients (accumulate(), the dataloader's end) is the boundary
        self.engine.set_gradient_accumulation_boundary(self.sync_gradients)
        self.engine.backward(loss)  # 1/accumulation applied by the engine
        if self.sync_gradients:
            self.engine.step()

    @contextlib.contextmanager
    def no_sync(self, model: Any) -> Iterator[None]:
        """Nothing for the engine, as on Accelerate's DeepSpeed path at stages 2-3: its reduction follows the
        boundary `backward` sets from `sync_gradients` (accumulate() enters this on the other micro-batches)."""
        if model is not self.engine:
            with super().no_sync(model):
                yield
            return
        yield

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: int = 2) -> Any:
        """The engine clips at its step (the config's gradient_clipping), as Accelerate's DeepSpeed path does, whatever
        `max_norm` says; this returns its norm (a host sync)."""
        if self.engine is None:
            return super().clip_grad_norm_(parameters, max_norm, norm_type)
        clipping = self.engine.config.gradient_clipping
        if not self._told_clipping and float(max_norm) != float(clipping):
            self._told_clipping = True  # once: the loop calls this every update
            if self.is_main_process:
                shown = f"{clipping}{': no clipping' if clipping == 0 else ''}"
                print(f"zero_core: clip_grad_norm_(max_norm={max_norm}): the engine clips at the DeepSpeed config's "
                      f"gradient_clipping ({shown}), as Accelerate's DeepSpeed path does; set "
                      "DeepSpeedPlugin(gradient_clipping=...) or the config's gradient_clipping to change it",
                      flush=True)
        norm = self.engine.get_global_grad_norm()  # Accelerate's DeepSpeed path hands back a float, or None
        return norm.item() if isinstance(norm, torch.Tensor) else norm

    def unwrap_model(self, model: Any, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True) -> Any:
        if isinstance(model, Engine):
            return model.module
        return super().unwrap_model(model, keep_fp32_wrapper, keep_torch_compile)

    def get_state_dict(self, model: Any, unwrap: bool = True) -> dict[str, torch.Tensor]:
        """Collective: the full fp32 weights on every rank, keys as the model's state_dict()."""
        if isinstance(model, Engine):
            return model.full_state_dict()
        return super().get_state_dict(model, unwrap)

    def save_state(self, output_dir: str | None = None, **kwargs: Any) -> str:
        """A zbench checkpoint of the engine (weights, optimizer, schedule, step) in `output_dir`, or in the next
        numbered folder with automatic checkpoint naming (accelerate_folders.py)."""
        if self.engine is None:
            return super().save_state(output_dir, **kwargs)
        registered = registered_states(self._custom_objects)  # refused before the collective save starts
        folder = save_folder(self, output_dir)
        state = {ACCUMULATION_STEP: self.step} | ({REGISTERED: registered} if registered else {})
        self.engine.save_checkpoint(folder, client_state=state)
        saved(self)
        return folder

    def load_state(self, input_dir: str | None = None, **kwargs: Any) -> None:
        if self.engine is None:
            raise ValueError("load_state needs the prepared model: call accelerator.prepare(model, ...) first")
        input_dir = load_folder(self, input_dir)
        folder, client_state = self.engine.load_checkpoint(input_dir)
        if folder is not None:
            restore_registered(self._custom_objects, client_state.get(REGISTERED, []), input_dir)
            step = client_state.get(ACCUMULATION_STEP)  # where accumulate() is in its window, as Accelerate keeps it
            if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
                self.step = step


def prepare(*objects: Any, zero_config: Any = None, **accelerator_kwargs: Any) -> tuple[Accelerator, Any]:
    """(an Accelerator, its prepare(*objects)) in one call, for scripts that build the Accelerator inline."""
    accelerator = Accelerator(zero_config=zero_config, **accelerator_kwargs)
    return accelerator, accelerator.prepare(*objects)
