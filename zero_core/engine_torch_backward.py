"""DeepSpeed's torch-style backward: `engine.scale(loss).backward()`, or a plain `loss.backward()` on what the
engine's forward returned, followed by `engine.step()`, trains as `engine.backward(loss)` does.

`watch_outputs(engine)` hooks the gradient of every tensor each forward returns. A backward that reaches one
without `engine.backward` having started it (the engine's count of backward passes has not moved since that
forward) opens the engine's backward there: the outputs' gradients arrive before any parameter's, so the
gradient reduction is readied in time, and its close is queued for the end of autograd's pass. The division by
the accumulation steps that engine.backward applies to the loss is applied to each parameter's gradient as it
arrives in such a pass (hooks added at the first one), so a loss computed from two returned tensors (a model's
loss and the logits it came from) is divided once, as engine.backward divides it.

Without the hooks a plain `loss.backward()` would leave the gradients outside the engine's reduction, and the
step would update from none.
"""

from __future__ import annotations

from typing import Any

import torch

from .config_errors import ConfigError
from .engine_wall_clock import wall_clock


class TorchStyleBackward:
    """Mixed into the engine: `scale(loss)`, DeepSpeed's loss scaling for a backward the script runs itself."""

    _loss_scaled = False  # scale() was called: the next torch-style backward's loss carries the loss scale

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """`loss` times the current loss scale (1 unless fp16), for `engine.scale(loss).backward()`; the hooks on
        the forward's outputs divide by the accumulation steps and reduce the gradients, as engine.backward."""
        if self.training_refused:
            raise ConfigError(self.training_refused)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or loss.grad_fn is None:
            raise ValueError("engine.scale(loss) takes the scalar loss of a forward run with gradients (a tensor with "
                             "a grad_fn); for a tensor of several values call tensor.backward(gradient) directly")
        self._loss_scaled = True
        return loss * self.scaler.scale.squeeze().to(loss.dtype)


def watch_outputs(engine: Any) -> Any:
    """Hook every forward's returned tensors (the handle of the forward hook)."""

    def on_forward(_module: Any, _args: Any, output: Any) -> None:
        started_at = engine._window_passes
        for tensor in _tensors(output):
            if tensor.requires_grad and tensor.grad_fn is not None:
                tensor.register_hook(lambda grad: _on_output_grad(engine, started_at, grad))

    return engine.register_forward_hook(on_forward)


def _tensors(output: Any) -> list[torch.Tensor]:
    """The tensors in a forward's result: itself, or inside tuples, lists and dicts (a ModelOutput is a dict)."""
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (tuple, list)):
        return [t for item in output for t in _tensors(item)]
    if isinstance(output, dict):
        return [t for item in output.values() for t in _tensors(item)]
    return []


def _on_output_grad(engine: Any, started_at: int, grad: torch.Tensor) -> torch.Tensor:
    if not engine.__dict__.get("_torch_backward_open") and engine._window_passes == started_at:
        _open(engine)  # else engine.backward runs this pass (or this pass is open already)
    return grad


def close_stale_pass(engine: Any) -> None:
    """Outside autograd no torch-style pass is running: one still marked open was cut short by an exception, and
    must not scale the gradients of the engine.backward that follows (called where the engine asks its boundary)."""
    if engine.__dict__.get("_torch_backward_open") and torch._C._current_graph_task_id() == -1:
        engine.__dict__["_torch_backward_open"] = False


def _scale_param_grads(engine: Any) -> None:
    """Each trainable parameter's gradient, in a torch-style pass, divided by the accumulation steps (and times
    the loss scale under fp16 where the script did not call scale()), before it is accumulated and reduced."""

    def scaled(grad: torch.Tensor) -> torch.Tensor:
        if not engine.__dict__.get("_torch_backward_open"):
            return grad  # engine.backward's pass: its loss carries the factor
        grad = grad / engine.gradient_accumulation_steps()
        if engine.__dict__["_torch_backward_scaled"] or engine.dtype != torch.float16:
            return grad
        return grad * engine.scaler.scale.squeeze().to(grad.dtype)

    for p in engine.reducer.params:
        p.register_hook(scaled)
    engine.__dict__["_torch_backward_hooked"] = True


def _open(engine: Any) -> None:
    """engine.backward's start, run where autograd reaches the forward's outputs (engine_backward.py)."""
    if engine.training_refused:
        raise ConfigError(engine.training_refused)
    if not engine.__dict__.get("_torch_backward_hooked"):
        _scale_param_grads(engine)
    boundary = engine.begin_backward()
    # open until the end of autograd's pass, nested ones included (a reentrant activation checkpoint's backward)
    engine.__dict__.update(_torch_backward_open=True, _torch_backward_scaled=engine._loss_scaled)
    engine._loss_scaled = False
    torch.autograd.Variable._execution_engine.queue_callback(lambda: _close(engine, boundary))


def _close(engine: Any, boundary: bool) -> None:
    """engine.backward's end, once autograd's pass has computed every gradient."""
    engine.__dict__["_torch_backward_open"] = False
    engine.end_backward(boundary)
    wall_clock(engine).backward_done(None)
