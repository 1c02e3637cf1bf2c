"""The engine's backward pass, in two halves around autograd's: `engine.backward(loss)` runs both itself, and a
torch-style backward (`engine.scale(loss).backward()`, engine_torch_backward.py) opens it where autograd reaches
the forward's outputs and closes it at the end of autograd's pass."""

from __future__ import annotations

import torch

from .config_errors import ConfigError
from .engine_wall_clock import wall_clock


class BackwardPass:
    """Mixed into the engine."""

    def backward(self, loss: torch.Tensor, retain_graph: bool = False, scale_wrt_gas: bool = True) -> torch.Tensor:
        """Backward of `loss` scaled by the loss scale and 1/accumulation steps; reduces gradients.
        `scale_wrt_gas=False` (DeepSpeed's flag) leaves out 1/accumulation steps, for a loss its caller
        already normalised over the accumulated batch (Hugging Face Trainer's); `retain_graph` as torch's."""
        boundary = self.begin_backward()
        gas = self.gradient_accumulation_steps() if scale_wrt_gas else 1
        (loss * (self.scaler.scale.squeeze() / gas)).backward(retain_graph=retain_graph)
        self.end_backward(boundary)
        # as DeepSpeed's, for `loss = engine.backward(loss)`: the loss divided by the accumulation steps (the
        # micro-batch's share of the window's loss), not by the loss scale
        return wall_clock(self).backward_done(loss if gas == 1 else loss / gas)

    def begin_backward(self) -> bool:
        """Ready the gradient reduction for the pass about to run; whether it ends an accumulation window."""
        if self.training_refused:
            raise ConfigError(self.training_refused)
        wall_clock(self).backward_started()
        self.wait_for_weights()  # buckets no module's forward read (unused parameters)
        boundary = self.is_gradient_accumulation_boundary()
        every = self.strategy.reduces_every_micro_step
        gas = self.gradient_accumulation_steps()
        window_pos = self.micro_steps % gas if self._boundary_set is None else self._window_passes
        self._window_passes += 1
        self.strategy.before_backward()
        self.reducer.begin(reduce_now=every or boundary, accumulate=every and window_pos > 0,
                           scale=self.scaler.inv_scale / self.world_size, final=boundary)
        wall_clock(self).autograd_started()
        return boundary

    def end_backward(self, boundary: bool) -> None:
        """Autograd's pass is over: finish the reductions it left queued."""
        self.breakdown.backward_done()
        wall_clock(self).autograd_done()
        self.reducer.finish()
        self.strategy.after_backward()
        self.gradients_ready = boundary
