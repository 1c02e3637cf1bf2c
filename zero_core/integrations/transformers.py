"""Hugging Face Trainer on zero_core: the same script and DeepSpeed config, one changed import.

    from zero_core.integrations.transformers import Trainer, TrainingArguments   # was: from transformers import ...
    args = TrainingArguments(output_dir="out", deepspeed="ds_config.json", ...)   # the same file, "auto" and all
    Trainer(model=model, args=args, train_dataset=ds).train()

`TrainingArguments` keeps the `deepspeed=` config as `zero_config` and hides it from transformers and
Accelerate, which would start DeepSpeed. `ZeroTrainer` (also exported as `Trainer`) builds zero_core's engine
where Trainer builds DeepSpeed's, in `_prepare_for_training`: "auto" is filled as Trainer fills it
(config_auto.py). A config that names an optimizer gets every trainable parameter in one group, as Trainer hands
them to DeepSpeed (its weight decay applies to biases and norms too); without one, Trainer's own optimizer and
decay / no-decay groups are used, and Trainer's scheduler unless the config names one. Everything else is
Trainer's loop: accumulation, eval, logging, callbacks, checkpoint rotation.
Checkpoints are zbench's, inside `checkpoint-N/` (any world size or stage resumes them), beside a
`save_pretrained` folder of the full fp32 weights.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch
import transformers

from ..checkpoint_load import nothing_to_resume
from ..config_file import config_data
from ..config_auto import AutoValues
from ..config_errors import ConfigError
from ..engine import Engine
from ..model_export import full_state_dict
from .accelerate_launched import LAUNCHED, launched_config
from .accelerate_schedules import ScriptSteps
from .handles import EngineOptimizer, EngineSchedule, hidden_size
from .transformers_best_model import load_best, refuse_best_without_states
from .transformers_metric_schedules import held_by_engine
from .transformers_processes import refuse_unsplit_launch

_BATCH_KEYS = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


@dataclasses.dataclass
class TrainingArguments(transformers.TrainingArguments):
    """transformers.TrainingArguments whose `deepspeed=` config (a path or a dict) zero_core runs; without one, the
    config `accelerate launch` exported for a DEEPSPEED config file, as transformers takes it."""

    def __post_init__(self) -> None:
        self.zero_config = self.deepspeed or launched_config()  # transformers would build DeepSpeed's plugin from it
        self.deepspeed = None
        use_deepspeed = os.environ.pop(LAUNCHED, None)  # and from what `accelerate launch` exported
        try:
            super().__post_init__()
        finally:
            if use_deepspeed is not None:
                os.environ[LAUNCHED] = use_deepspeed


def _knows_engine(accelerator: Any, engine: Engine) -> None:
    """Teach Trainer's Accelerator the engine, as Accelerate's DeepSpeed path knows DeepSpeed's: fine-tuning scripts
    save `trainer.accelerator.get_state_dict(trainer.model_wrapped)`, which would otherwise hold the engine's
    `module.`-prefixed keys (or, at stage 3, refuse)."""
    unwrap, get_state_dict = accelerator.unwrap_model, accelerator.get_state_dict

    def unwrap_model(model: Any, *args: Any, **kwargs: Any) -> Any:
        return engine.module if model is engine else unwrap(model, *args, **kwargs)

    def engine_state_dict(model: Any, unwrap: bool = True) -> dict[str, torch.Tensor]:
        """Collective for the engine or its model: the full fp32 weights on every rank, keyed as the model's."""
        return engine.full_state_dict() if model is engine or model is engine.module else get_state_dict(model, unwrap)

    accelerator.unwrap_model, accelerator.get_state_dict = unwrap_model, engine_state_dict


def _config_source(args: Any) -> Any:
    if getattr(args, "deepspeed", None):
        raise ValueError(
            "ZeroTrainer got transformers.TrainingArguments(deepspeed=...), which starts DeepSpeed; "
            "build them with zero_core.integrations.transformers.TrainingArguments"
        )
    source = getattr(args, "zero_config", None)
    if not source:
        raise ValueError(
            "ZeroTrainer needs a DeepSpeed config: pass TrainingArguments(deepspeed='ds_config.json') "
            "from zero_core.integrations.transformers"
        )
    return source


def _not_resumable(folder: str) -> str:
    """Why `folder` cannot be resumed: it holds no zbench or DeepSpeed checkpoint (e.g. plain Trainer's files)."""
    names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    held = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
    return (
        f"resume_from_checkpoint={folder!r} holds {held or 'nothing'} but no zbench or DeepSpeed checkpoint ('latest', "
        "global_stepN/), so the weights, optimizer and schedule cannot be restored; resume from a checkpoint-N this "
        "trainer saved, or start from the weights there by loading the model from that folder (from_pretrained) "
        "and training without resume_from_checkpoint"
    )


class ZeroTrainer(transformers.Trainer):
    """transformers.Trainer that trains with zero_core's engine from the DeepSpeed config in its arguments."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if not hasattr(transformers.Trainer, "_prepare_for_training"):  # where the engine is built
            raise ValueError(f"ZeroTrainer needs transformers >= 5 (found {transformers.__version__}); upgrade it")
        super().__init__(*args, **kwargs)
        self.zero_config_source = _config_source(self.args)
        refuse_best_without_states(self.args)
        self.engine: Engine | None = None

    # -- building the engine where Trainer builds DeepSpeed's -------------------------------------
    def _prepare_for_training(self, max_steps: int, train_dataloader: Any, resume_from_checkpoint: Any) -> Any:
        if self.engine is not None:
            raise ValueError(
                "ZeroTrainer.train() runs once per trainer; build a new ZeroTrainer to train again "
                "(resume_from_checkpoint= continues a run)"
            )
        if resume_from_checkpoint is not None and nothing_to_resume(resume_from_checkpoint):
            # the engine would start from the current weights while Trainer's state skips the saved steps
            raise ValueError(_not_resumable(os.fspath(resume_from_checkpoint)))
        refuse_unsplit_launch(self.args)
        raw = self.zero_config_source
        raw = dict(config_data(raw))
        for key in _BATCH_KEYS:  # a config without batch sizes takes Trainer's, as Accelerate fills them
            raw.setdefault(key, "auto")
        passed = self.optimizer  # Trainer(optimizers=...); create_optimizer() below sets self.optimizer too
        optimizer, groups, scheduler = self._optimizer_plan(raw, max_steps)
        try:
            self.engine = Engine(
                self.model,
                raw,
                model_parameters=groups,
                optimizer=optimizer,
                lr_scheduler=scheduler,
                auto=self._auto_values(max_steps),
            )
        except ConfigError as e:
            if optimizer is None or optimizer is passed or "zero_allow_untested_optimizer" not in str(e):
                raise
            # Trainer built it (optim=, optimizer_cls_and_kwargs=); the engine names a config key the user never set
            optim = str(getattr(self.args.optim, "value", self.args.optim))  # an OptimizerNames member
            source = ("Trainer(optimizer_cls_and_kwargs=...)" if getattr(self, "optimizer_cls_and_kwargs", None)
                      else f"TrainingArguments(optim={optim!r})")
            raise ValueError(
                f"{source} gives {type(optimizer).__name__}, whose update is not known to be element-wise, and "
                "zero_core runs the optimizer on flat shards; choose an element-wise optimizer such as "
                "optim='adamw_torch', or name the optimizer in the DeepSpeed config's 'optimizer' section"
            ) from None
        handle = EngineOptimizer(self.engine)
        # Trainer's own scheduler over its own optimizer is not DeepSpeed's to step: Trainer steps it after logging
        stepped_by_loop = "optimizer" not in raw and "scheduler" not in raw
        self.optimizer = handle
        held = self.engine.lr_scheduler
        if isinstance(held, ScriptSteps):  # a metric scheduler Trainer steps after each evaluation
            self.lr_scheduler = held.scheduler
        else:
            self.lr_scheduler = EngineSchedule(self.engine, handle, stepped_by_loop)
        self.model_wrapped = self.deepspeed = self.engine  # `trainer.deepspeed`: the engine, as on DeepSpeed
        _knows_engine(self.accelerator, self.engine)
        if resume_from_checkpoint is not None:
            self.engine.load_checkpoint(resume_from_checkpoint)
            if isinstance(self.lr_scheduler, EngineSchedule):
                self.lr_scheduler.restart()
        for attr in ("model", "optimizer", "lr_scheduler"):
            setattr(self.callback_handler, attr, getattr(self, attr))
        self.callback_handler.train_dataloader = train_dataloader
        return self.engine, train_dataloader

    def _wrap_model(self, model: torch.nn.Module, training: bool = True, dataloader: Any = None) -> torch.nn.Module:
        """The engine, once built, for eval and predict too: Accelerate must not move or wrap the module, whose
        parameters are views of the engine's buffers."""
        return self.engine if self.engine is not None else super()._wrap_model(model, training, dataloader)

    def _auto_values(self, max_steps: int) -> AutoValues:
        a = self.args
        return AutoValues(
            world_size=a.world_size,
            per_device_train_batch_size=a.per_device_train_batch_size,
            gradient_accumulation_steps=a.gradient_accumulation_steps,
            max_grad_norm=a.max_grad_norm,
            learning_rate=a.learning_rate,
            adam_beta1=a.adam_beta1,
            adam_beta2=a.adam_beta2,
            adam_epsilon=a.adam_epsilon,
            weight_decay=a.weight_decay,
            fp16=bool(a.fp16 or a.fp16_full_eval),
            bf16=bool(a.bf16 or a.bf16_full_eval),
            hidden_size=hidden_size(self.model),
            max_steps=max_steps,
            warmup_steps=a.get_warmup_steps(max_steps),
        )

    def _optimizer_plan(self, raw: dict, max_steps: int) -> tuple[Any, Any, Any]:
        """(optimizer, parameter groups, scheduler) for the engine: the optimizer passed to Trainer, else the
        config's over every trainable parameter (transformers' deepspeed_init passes DeepSpeed that one group),
        else Trainer's own; the scheduler passed, else the config's (None here), else Trainer's built on the
        engine's optimizer."""
        optimizer, groups = self.optimizer, None
        passed = ((optimizer, "an optimizer", "optimizer"), (self.lr_scheduler, "a scheduler", "scheduler"))
        for given, what, section in passed:
            if given is not None and section in raw:  # the engine would say "passed to initialize"
                raise ValueError(
                    f"Trainer(optimizers=...) got {what} and the DeepSpeed config has its own '{section}' section; "
                    "drop one of them"
                )
        if optimizer is None and "optimizer" in raw:
            groups = [p for p in self.model.parameters() if p.requires_grad]
        elif optimizer is None:
            optimizer = self.create_optimizer()
        a = self.args
        batch = a.world_size * a.per_device_train_batch_size * a.gradient_accumulation_steps
        scheduler = held_by_engine(self.lr_scheduler, False, batch)  # a passed one runs on the passed optimizer
        if scheduler is None and "scheduler" not in raw:

            def scheduler(opt: torch.optim.Optimizer) -> Any:  # DeepSpeed's form: built on the engine's optimizer
                made = self.create_scheduler(num_training_steps=max_steps, optimizer=opt)
                return held_by_engine(made, "optimizer" in raw, batch)

        return optimizer, groups, scheduler

    # -- the step: the engine's backward, clipping and update ---------------------------------------
    def training_step(
        self, model: torch.nn.Module, inputs: dict[str, Any], num_items_in_batch: torch.Tensor | int | None = None
    ) -> torch.Tensor:
        if self.engine is None:
            return super().training_step(model, inputs, num_items_in_batch)
        self.engine.train()
        inputs = self._prepare_inputs(inputs)
        with self.compute_loss_context_manager():  # the model itself, so label smoothing sees its class
            loss = self.compute_loss(self.model, inputs, num_items_in_batch=num_items_in_batch)
        scaled_for_ga = getattr(self, "loss_is_scaled_for_ga", None)  # a class attribute from transformers 5.2x
        if scaled_for_ga is None:  # Trainer's rule: normalised by num_items_in_batch or by compute_loss_func
            scaled_for_ga = (self.model_accepts_loss_kwargs and num_items_in_batch is not None) or getattr(
                self, "compute_loss_func", None
            ) is not None
        if not scaled_for_ga:
            loss = loss / self.current_gradient_accumulation_steps
        # Trainer's window is the boundary, as Accelerate's DeepSpeed wrapper sets it: an epoch's last window may be
        # shorter than gradient_accumulation_steps, and still ends in an update
        update = self.accelerator.sync_gradients
        self.engine.set_gradient_accumulation_boundary(update)
        self.engine.backward(loss, scale_wrt_gas=False)
        if update:
            self.engine.step()
        return loss.detach()

    def _prepare_input(self, data: Any) -> Any:
        data = super()._prepare_input(data)
        if self.engine is not None and isinstance(data, torch.Tensor) and torch.is_floating_point(data):
            return data.to(self.engine.dtype)  # as Trainer casts inputs for DeepSpeed
        return data

    def _clip_grad_norm(self, model: torch.nn.Module) -> Any:
        if self.engine is None:
            return super()._clip_grad_norm(model)
        return None  # the engine clipped at its step (the config's gradient_clipping, "auto" = max_grad_norm)

    def _get_grad_norm(self, model: torch.nn.Module, grad_norm: Any = None) -> Any:
        if self.engine is None:
            return super()._get_grad_norm(model, grad_norm)
        return self.engine.get_global_grad_norm()

    # -- state --------------------------------------------------------------------------------------
    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        if self.engine is None:
            return super()._save_optimizer_and_scheduler(output_dir)
        self.engine.save_checkpoint(output_dir)  # a zbench checkpoint: weights, optimizer, schedule, step

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: torch.nn.Module | None = None) -> None:
        """Nothing yet: `_prepare_for_training` loads the zbench checkpoint into the engine (any world size, stage)."""

    def _load_best_model(self) -> None:
        if self.engine is None:
            return super()._load_best_model()
        load_best(self.engine, self.state.best_model_checkpoint)  # with its optimizer and schedule, as DeepSpeed's

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """A folder `from_pretrained` opens, at every stage: the fp32 weights gathered from the masters, written
        by the model's `save_pretrained` (tied weights once, config.json, the tokenizer)."""
        if self.engine is None:
            return super().save_model(output_dir, _internal_call)
        state = full_state_dict(self.engine, keep=self.args.should_save)  # collective
        self._save(output_dir if output_dir is not None else self.args.output_dir, state_dict=state)
        if self.args.push_to_hub and not _internal_call:
            self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)


Trainer = ZeroTrainer


from .transformers_seq2seq import Seq2SeqTrainer, Seq2SeqTrainingArguments  # noqa: E402  (built on ZeroTrainer)

__all__ = ["Seq2SeqTrainer", "Seq2SeqTrainingArguments", "Trainer", "TrainingArguments", "ZeroTrainer"]
