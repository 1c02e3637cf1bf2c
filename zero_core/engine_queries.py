"""DeepSpeed engine queries that read the config as the script gave it: `engine.config["key"]`,
`engine.loss_scale()`, the ZeRO bucket and optimizer/scheduler getters."""

from __future__ import annotations

from typing import Any

import torch
from pydantic import PrivateAttr

from .config_models import ZeroConfig
from .config_optimizer_types import reported_name

_BATCH = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


class ItemConfig(ZeroConfig):
    """The validated config, also read by item like DeepSpeed's `engine.config` (the config dict as given,
    its "auto" values filled and the three batch sizes resolved)."""

    _given: dict = PrivateAttr(default_factory=dict)

    def _as_dict(self) -> dict:
        out = dict(self._given)
        out.update({k: getattr(self, k) for k in _BATCH})
        return out

    def __getitem__(self, key: str) -> Any:
        return self._as_dict()[key]

    def __contains__(self, key: object) -> bool:
        return key in self._as_dict()

    def get(self, key: str, default: Any = None) -> Any:
        return self._as_dict().get(key, default)

    def keys(self) -> Any:
        return self._as_dict().keys()


def given_dict(config: Any) -> dict:
    """The config as the script gave it, as a dict (a JSON file read; a ZeroConfig gives an empty one)."""
    if isinstance(config, dict):
        return config
    if isinstance(config, ItemConfig):
        return dict(config._given)
    if isinstance(config, ZeroConfig):
        return {}
    from .config import _raw

    raw = _raw(config)[0]
    return raw if isinstance(raw, dict) else {}


def with_items(cfg: ZeroConfig, given: Any) -> ZeroConfig:
    """`cfg`, readable by item from `given` (a dict; anything else leaves only the batch sizes)."""
    if type(cfg) is ZeroConfig:
        cfg.__class__ = ItemConfig
    if isinstance(cfg, ItemConfig):
        cfg._given = dict(given)
    return cfg


def global_grad_norm(engine: Any) -> torch.Tensor | None:
    """DeepSpeed's get_global_grad_norm(): a 0-dim tensor (fp64 at stage 3, fp32 below, as DeepSpeed computes it:
    optim/clip_norm.py); None before a step, and at stage 0 without fp16/bf16."""
    if not engine.norm_taken or (engine.stage == 0 and engine.dtype == torch.float32):
        return None
    return engine.optimizer.grad_norm.detach().reshape(()).to("cpu")


class LossScaleValue(float):
    """`engine.loss_scale`: the current loss scale as a number; called, as DeepSpeed's `engine.loss_scale()`,
    the config's static `fp16.loss_scale` (0.0: dynamic or none)."""

    def __new__(cls, value: float, configured: float) -> "LossScaleValue":
        out = super().__new__(cls, value)
        out.configured = float(configured)
        return out

    def __call__(self) -> float:
        return self.configured

    def __reduce__(self) -> tuple:
        return float, (float(self),)  # pickled (to another process) as the plain number


class EngineQueries:
    """Mixed into the engine: DeepSpeed's getters of ZeRO, optimizer and scheduler settings, and its `_config`,
    `monitor` and `timers` attributes (each made on first use)."""

    training_dataloader: Any = None  # deepspeed.initialize(training_data=...) sets the loader it built
    # deepspeed.initialize's engines checkpoint as DeepSpeed's: save leaves zero_to_fp32.py beside the checkpoint
    # (recovery_script.py), load returns DeepSpeed's client_state (checkpoint_client_state.py); others return the
    # keys the script saved, as saved
    deepspeed_checkpoints = False

    @property
    def _config(self) -> Any:
        """DeepSpeed's DeepSpeedConfig object, read-only (engine_ds_config.py)."""
        from .engine_ds_config import DeepSpeedConfigView

        return DeepSpeedConfigView(self)

    @property
    def monitor(self) -> Any:
        """DeepSpeed's MonitorMaster: `write_events([(tag, value, step), ...])` (engine_monitor.py)."""
        if "_monitor" not in self.__dict__:
            from .engine_monitor import EngineMonitor

            self.__dict__["_monitor"] = EngineMonitor(self.config, self.rank)
        return self.__dict__["_monitor"]

    @property
    def timers(self) -> Any:
        """DeepSpeed's wall-clock timers: `timers(name).start()` / `.stop()`, `timers.log([names])`."""
        if "_timers" not in self.__dict__:
            from .engine_timers import EngineTimers

            self.__dict__["_timers"] = EngineTimers(self.device, self.rank)
        return self.__dict__["_timers"]

    def zero_reduce_bucket_size(self) -> int:
        return int(self.config.zero_optimization.reduce_bucket_size)

    def zero_allgather_bucket_size(self) -> int:
        return int(self.config.zero_optimization.allgather_bucket_size)

    def zero_contiguous_gradients(self) -> bool:
        return bool(self.config.zero_optimization.contiguous_gradients)

    def zero_gather_16bit_weights_on_model_save(self) -> bool:
        return bool(self.config.zero_optimization.stage3_gather_16bit_weights_on_model_save)

    def optimizer_name(self) -> str | None:
        """The script's optimizer class name, else the config's optimizer type: DeepSpeed's own names lower-cased,
        a torch.optim class's as written (as DeepSpeed)."""
        client = getattr(self, "_client_given", None)
        if client is not None:
            return type(client).__name__
        section = self.config.get("optimizer") or {}
        name = section.get("type") if isinstance(section, dict) else None
        return reported_name(name) if isinstance(name, str) else None

    def optimizer_params(self) -> dict | None:
        section = self.config.get("optimizer") or {}
        return section.get("params") if isinstance(section, dict) else None

    def scheduler_name(self) -> str | None:
        section = self.config.get("scheduler") or {}
        return section.get("type") if isinstance(section, dict) else None

    def scheduler_params(self) -> dict | None:
        section = self.config.get("scheduler") or {}
        return section.get("params") if isinstance(section, dict) else None
