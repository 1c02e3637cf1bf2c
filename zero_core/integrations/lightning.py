"""Lightning on zero_core: `Trainer(strategy=ZeroStrategy(stage=3, offload_optimizer=True, config=...))`, or one of
the registered names (Lightning's DeepSpeed names with a `zero_` prefix, so both can be installed):

    zero_core, zero_stage_1, zero_stage_2, zero_stage_2_offload, zero_stage_3, zero_stage_3_offload,
    zero_stage_3_offload_nvme (needs config={"zero_optimization": {"offload_optimizer": {"nvme_path": ...}}})

The strategy builds zero_core's engine where Lightning's DeepSpeed strategy builds DeepSpeed's (in place of
the DDP wrapper), from `configure_optimizers`' one optimizer (or the config's) and its step-interval scheduler.
The config's "auto" values are filled from the Trainer (accumulate_grad_batches, gradient_clip_val, precision,
the optimizer's lr, estimated_stepping_batches). Checkpoints go through Lightning's API as zbench checkpoint
folders (`trainer.save_checkpoint(path)`, `ckpt_path=` on any world size or stage; `zbench convert` reads them):
the Lightning state rides in the checkpoint's client_state as plain JSON data.
"""

from __future__ import annotations

import copy
import math
import os
from pathlib import Path
from typing import Any, Mapping

import torch
from lightning.pytorch.core.optimizer import _init_optimizers_and_lr_schedulers
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.types import LRSchedulerConfig

from ..config import read_config_file
from ..config_auto import AutoValues
from ..engine import Engine
from .handles import EngineOptimizer, EngineSchedule, hidden_size
from .lightning_convert import convert_zero_checkpoint_to_fp32_state_dict
from .lightning_kwargs import configure_activation_checkpointing, fill_missing, split_deepspeed_kwargs
from .lightning_precision import MODES, ZeroPrecision, format_precision

__all__ = ["ZeroStrategy", "ZeroPrecision", "convert_zero_checkpoint_to_fp32_state_dict", "plain_data"]

class ZeroStrategy(DDPStrategy):
    strategy_name = "zero_core"

    def __init__(
        self,
        stage: int | None = None,
        offload_optimizer: bool = False,
        offload_parameters: bool = False,
        config: str | os.PathLike | Mapping[str, Any] | None = None,
        offload_device: str = "cpu",
        exclude_frozen_parameters: bool = False,
        **kwargs: Any,
    ) -> None:
        """`stage`, `offload_*` and the other DeepSpeedStrategy arguments fill what `config` leaves out."""
        named = {"offload_optimizer": offload_optimizer, "offload_parameters": offload_parameters,
                 "offload_device": offload_device, **({"stage": stage} if stage is not None else {})}
        defaults, self._fp16_values, strategy_args = split_deepspeed_kwargs({**kwargs, **named})
        super().__init__(**strategy_args)
        raw = (
            read_config_file(os.fspath(config))
            if isinstance(config, (str, os.PathLike))
            else copy.deepcopy(dict(config or {}))
        )
        fill_missing(raw, defaults)
        raw.setdefault("zero_optimization", {}).setdefault("stage", 2)
        self.zero_config, self.engine = raw, None
        self.exclude_frozen_parameters = exclude_frozen_parameters

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        named = {
            "zero_core": {},
            "zero_stage_1": {"stage": 1},
            "zero_stage_2": {"stage": 2},
            "zero_stage_2_offload": {"stage": 2, "offload_optimizer": True},
            "zero_stage_3": {"stage": 3},
            "zero_stage_3_offload": {"stage": 3, "offload_optimizer": True, "offload_parameters": True},
            "zero_stage_3_offload_nvme": {"stage": 3, "offload_optimizer": True, "offload_device": "nvme"},
        }
        for name, kwargs in named.items():
            strategy_registry.register(name, cls, description=f"zero_core ZeRO {kwargs or 'from the config'}", **kwargs)

    # -- the engine where DDP would wrap the module -------------------------------------------------
    def configure_ddp(self) -> None:
        trainer = self.lightning_module.trainer
        flag = str(self.precision_plugin.precision)
        if flag not in MODES:
            raise ValueError(
                f"ZeroStrategy trains in 32, 16-mixed or bf16-mixed precision, not {flag}; change "
                "Trainer(precision=...)"
            )
        self.precision_plugin = ZeroPrecision(flag, self)
        if trainer.gradient_clip_algorithm not in (None, "norm"):
            raise ValueError("ZeroStrategy clips gradients by norm only; use Trainer(gradient_clip_algorithm='norm')")
        optimizers, schedulers = _init_optimizers_and_lr_schedulers(self.lightning_module)
        if len(optimizers) > 1 or len(schedulers) > 1:
            raise ValueError(
                "ZeroStrategy trains with one optimizer and at most one scheduler; return one pair from "
                "configure_optimizers"
            )
        optimizer = optimizers[0] if optimizers else None
        schedule = schedulers[0] if schedulers else None
        # one stepped after every update goes to the engine; another (per epoch, every n steps, on a monitored
        # value) Lightning's loop steps, as with DeepSpeedStrategy: its lr writes reach the engine's groups
        loop_schedule = schedule if schedule is not None and not _every_update(schedule) else None
        raw = copy.deepcopy(self.zero_config)
        format_precision(raw, flag, self._fp16_values)
        if loop_schedule is not None and "scheduler" in raw:
            raise ValueError(
                "the config's scheduler section and the lr_scheduler configure_optimizers returns would both set "
                "the lr; drop one of them"
            )
        if "optimizer" in raw:
            if schedule is not None:  # it would be bound to an optimizer that never steps
                raise ValueError(
                    "the config's optimizer section replaces the optimizer configure_optimizers returns, so its "
                    "lr_scheduler would never step; return only the optimizer from configure_optimizers and put "
                    "the schedule in the config's scheduler section, or drop the config's optimizer section"
                )
            optimizer = None  # the config's optimizer, as Lightning's DeepSpeed strategy does
        raw.setdefault("train_micro_batch_size_per_gpu", 1)  # only logged: the batches are the dataloader's
        clip = float(trainer.gradient_clip_val or 0.0)  # none given: no clipping, as Lightning's strategies
        raw.setdefault("gradient_clipping", clip)
        if raw.get("gradient_accumulation_steps", "auto") == "auto":  # "auto": the Trainer's, as documented
            raw["gradient_accumulation_steps"] = trainer.accumulate_grad_batches
        if raw["gradient_accumulation_steps"] != trainer.accumulate_grad_batches:
            raise ValueError(
                "the config's gradient_accumulation_steps differs from Trainer(accumulate_grad_batches); "
                "set one of them"
            )
        lr = optimizer.param_groups[0]["lr"] if optimizer is not None else None
        steps = trainer.estimated_stepping_batches
        auto = AutoValues(
            world_size=self.world_size,
            per_device_train_batch_size=1,  # an "auto" micro-batch size: only logged, the batches are the loader's
            gradient_accumulation_steps=trainer.accumulate_grad_batches,
            max_grad_norm=clip,
            fp16=MODES[flag] == "fp16",
            bf16=MODES[flag] == "bf16",
            learning_rate=lr,
            hidden_size=hidden_size(self.lightning_module),
            max_steps=int(steps) if math.isfinite(steps) and steps >= 1 else None,
        )
        self.engine = Engine(
            self.lightning_module,
            raw,
            optimizer=optimizer,
            lr_scheduler=schedule.scheduler if schedule is not None and loop_schedule is None else None,
            auto=auto,
        )
        if raw.get("activation_checkpointing"):  # as Lightning's DeepSpeed strategy, for deepspeed.checkpointing
            configure_activation_checkpointing(raw["activation_checkpointing"])
        handle = EngineOptimizer(self.engine)
        self.optimizers = [handle]
        if loop_schedule is not None:
            self.lr_scheduler_configs = [loop_schedule]
        elif schedule is not None or self.engine.lr_scheduler is not None:
            # Lightning hands back the state saved beside the engine's checkpoint, which has restored it already
            shown = EngineSchedule(self.engine, handle, loads=False)
            self.lr_scheduler_configs = [LRSchedulerConfig(shown, interval="step")]
        self.model = self.engine

    def setup_optimizers(self, trainer: Any) -> None:
        """Done in configure_ddp, with the engine."""

    def setup(self, trainer: Any) -> None:
        if trainer.state.fn != TrainerFn.FITTING and self.engine is not None:
            self.model = self.engine  # validate/test/predict after fit: the engine's weights
            self.accelerator.setup(trainer)
            return
        super().setup(trainer)

    def teardown(self) -> None:
        module, self._lightning_module = self._lightning_module, None  # its parameters stay the engine's views
        try:
            super().teardown()
        finally:
            self._lightning_module = module

    @property
    def handles_gradient_accumulation(self) -> bool:
        return True  # the engine counts micro-steps and reduces at the boundary

    # -- checkpoints: zbench folders through Lightning's API -----------------------------------------
    @property
    def restore_checkpoint_after_setup(self) -> bool:
        return True  # the engine must exist to load into

    @property
    def lightning_restore_optimizer(self) -> bool:
        return False  # engine.load_checkpoint restores it

    def lightning_module_state_dict(self) -> dict[str, Any]:
        return {}  # the weights are in the zbench checkpoint

    def optimizer_state(self, optimizer: Any) -> dict[str, Any]:
        return {}  # in the zbench checkpoint too: no copy of this rank's states for a dict save_checkpoint drops

    def save_checkpoint(self, checkpoint: dict, filepath: Any, storage_options: Any = None) -> None:
        if storage_options is not None:
            raise ValueError("ZeroStrategy saves zbench checkpoints; drop storage_options")
        filepath = self.broadcast(str(filepath))
        state = plain_data({k: v for k, v in checkpoint.items() if k not in ("state_dict", "optimizer_states")})
        self.engine.save_checkpoint(filepath, tag="checkpoint", client_state=state,
                                 exclude_frozen_parameters=self.exclude_frozen_parameters)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        if not Path(checkpoint_path).is_dir():
            raise ValueError(
                f"{checkpoint_path} is not a checkpoint folder ZeroStrategy wrote; pass the folder "
                "trainer.save_checkpoint made"
            )
        fitting = self.lightning_module.trainer.state.fn == TrainerFn.FITTING
        if self.engine is None:  # validate/test/predict(ckpt_path=...) on a fresh Trainer: fit built no engine
            self._build_evaluation_engine()
        _, client_state = self.engine.load_checkpoint(checkpoint_path, load_optimizer_states=fitting)
        return dict(client_state or {})  # the groups' lrs come back with the optimizer's states (checkpoint_load.py)

    def _build_evaluation_engine(self) -> None:
        """An engine to load the checkpoint's weights into, as DeepSpeedStrategy builds an inference engine: the
        config's ZeRO layout and precision, no client optimizer (its states are not loaded)."""
        trainer, flag = self.lightning_module.trainer, str(self.precision_plugin.precision)
        if flag not in MODES:
            raise ValueError(f"ZeroStrategy runs in 32, 16-mixed or bf16-mixed precision, not {flag}; change "
                             "Trainer(precision=...)")
        raw = copy.deepcopy(self.zero_config)
        format_precision(raw, flag, self._fp16_values)
        raw.pop("scheduler", None)  # nothing steps: its "auto" step counts need a fit
        raw.setdefault("train_micro_batch_size_per_gpu", 1)
        raw.setdefault("gradient_accumulation_steps", trainer.accumulate_grad_batches)
        auto = AutoValues(world_size=self.world_size, per_device_train_batch_size=1,
                          gradient_accumulation_steps=trainer.accumulate_grad_batches,
                          max_grad_norm=0.0, fp16=MODES[flag] == "fp16", bf16=MODES[flag] == "bf16",
                          learning_rate=None, hidden_size=hidden_size(self.lightning_module), max_steps=None)
        self.engine = Engine(self.lightning_module, raw, auto=auto)
        self.precision_plugin = ZeroPrecision(flag, self)  # batches in the engine's dtype
        self.model = self.engine

    def load_model_state_dict(self, checkpoint: Mapping[str, Any], strict: bool = True) -> None:
        """Nothing: load_checkpoint loaded the weights into the engine."""

    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        """Nothing: load_checkpoint loaded the optimizer states."""

    def remove_checkpoint(self, filepath: Any) -> None:
        if self.is_global_zero:
            self.checkpoint_io.remove_checkpoint(filepath)  # a folder this strategy wrote (ModelCheckpoint's rotation)


def _every_update(schedule: LRSchedulerConfig) -> bool:
    return schedule.interval == "step" and schedule.frequency == 1 and not schedule.reduce_on_plateau


def plain_data(value: Any) -> Any:
    """Lightning's checkpoint extras as JSON data: tensors as numbers or lists, paths and other objects as text."""
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, Mapping):
        return {str(k): plain_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_data(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return str(value)


ZeroStrategy.register_strategies(StrategyRegistry)
