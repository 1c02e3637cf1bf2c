"""Training loops for the tests of the host update that runs on after `step()` (stages/host_step_overlap.py).

`gate` makes the overlap deterministic: the update's thread publishes a chunk only once the training thread
has asked for a range that starts past it (a module's forward waiting for its weights, or a reader finishing
the update), so every forward after an update runs while most of that update is still unpublished, however
fast the host is."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from parity_workers import ds_config, make_batches, make_model

SMALL = {"ZERO_CORE_HOST_CHUNK_NUMEL": "1024"}  # several host chunks per unit


class Gate:
    def __init__(self, engine: Any) -> None:
        stage = engine.strategy
        self.inflight = inflight = stage.inflight
        self.cond = threading.Condition()
        self.asked = 0
        self.mid_update_waits = 0  # forward waits that found their range not yet published
        wait, finish, begin, publish = inflight.wait, inflight.finish, inflight.begin, stage.publish_chunk

        def asking_wait(buckets) -> None:
            ends = [inflight.bucket_ends[b] for b in buckets if b not in inflight._ready]
            if ends:
                with self.cond:
                    self.mid_update_waits += inflight._published < max(ends)
                    self.asked = max(self.asked, max(ends))
                    self.cond.notify_all()
            wait(buckets)

        def asking_finish() -> None:
            self.ask_all()
            finish()

        def fresh_begin() -> None:
            begin()
            with self.cond:
                self.asked = 0

        def gated_publish(a: int, b: int) -> None:
            if a < b:  # (a == b: the device share of a partial offload, published from the training thread)
                with self.cond:
                    self.cond.wait_for(lambda: a < self.asked)
            publish(a, b)

        inflight.wait, inflight.finish, inflight.begin = asking_wait, asking_finish, fresh_begin
        stage.publish_chunk = gated_publish

    def ask_all(self) -> None:
        with self.cond:
            self.asked = 1 << 62
            self.cond.notify_all()

    def blindfold(self) -> None:
        """Sabotage: the forward no longer waits for its weights (it reads what the update has not written)."""
        for h in self.inflight._hooks[:-1]:
            h.remove()


def optimizer_states(engine: Any) -> dict[str, torch.Tensor]:
    engine.wait_for_weights()
    parts: dict[str, list[torch.Tensor]] = {"master": [], "exp_avg": [], "exp_avg_sq": []}
    for _, _, views in engine.optimizer.states.stream(tuple(parts), write_back=False):
        for name, v in views.items():
            parts[name].append(v.detach().cpu().clone())
    return {name: torch.cat(vs) for name, vs in parts.items()}


def overlap_train(rank: int, world: int, cases: list[dict]) -> list[dict]:
    """Per case: stage 3 with optimizer offload, the update in step() or on its thread (gated); losses, the full
    state and the optimizer partition at the end, and what readers right after one step saw."""
    import zero_core

    results = []
    os.environ.update(SMALL)
    for case in cases:
        micro, gas, steps = case["micro"], case.get("gas", 1), case["steps"]
        cfg = ds_config(3, case["dtype"], micro, gas, case.get("clip", 0.0), **case["zero"])
        cfg["zero_core"] = {"overlap_weight_gather": case["overlap"]}
        engine = zero_core.initialize(make_model(), cfg)
        gate = Gate(engine) if case["overlap"] else None
        losses: list[float] = []
        read_after: dict[str, Any] = {}
        for i, (x, y) in enumerate(make_batches(steps * gas, micro * world)):
            xs, ys = (t[rank * micro : (rank + 1) * micro].to(engine.device) for t in (x, y))
            if gate is not None and case.get("blindfold") and i == gas:
                gate.blindfold()
            hook = None
            if case.get("inject_inf_at") == i:  # one rank's gradient poisoned: every rank skips the step
                hook = engine.module.ln_f.weight.register_hook(lambda g: g * float("inf") if rank == 0 else g)
            loss = engine(xs, ys).loss
            engine.backward(loss)
            if hook is not None:
                hook.remove()
            engine.step()
            if i == case.get("read_at"):  # readers right after step(), the update maybe still running
                read_after["full"] = engine.full_state_dict()
                tmp = Path(case["save_dir"]) / ("on" if case["overlap"] else "off")
                engine.save_checkpoint(tmp, tag="t")
                read_after["checkpoint"] = str(tmp / "t")
            mean = loss.detach().float().clone()
            dist.all_reduce(mean)
            losses.append(float(mean) / world)
        results.append({
            "losses": losses,
            "state": engine.full_state_dict(),
            "optimizer": optimizer_states(engine),
            "skipped": engine.skipped_steps,
            "scale": engine.loss_scale,
            "mid_update_waits": gate.mid_update_waits if gate is not None else 0,
            "inflight": engine.strategy.inflight is not None,
            "read_after": read_after,
        })
        engine.close()
    return results
