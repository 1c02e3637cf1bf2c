"""An optimizer or lr scheduler passed to initialize beside the config's own section for it: the passed object
wins, as DeepSpeed 0.19.8's engine builds its optimizer and schedule from the client's objects whenever they are
given, and rank 0 names the section left unused, which a script that meant the config's would not otherwise see."""

from __future__ import annotations

from typing import Any

from .config_models import ZeroConfig


def passed_objects_win(cfg: ZeroConfig, optimizer: Any, lr_scheduler: Any, rank: int) -> ZeroConfig:
    """`cfg` without the sections that `optimizer` and `lr_scheduler` (when given) stand in for."""
    unused = [name for name, passed, section in (("optimizer", optimizer, cfg.optimizer_given),
                                                 ("scheduler", lr_scheduler, cfg.scheduler is not None))
              if passed is not None and section]
    if not unused:
        return cfg
    if rank == 0:
        objects = " and ".join({"optimizer": "an optimizer", "scheduler": "an lr_scheduler"}[n] for n in unused)
        sections = " and ".join(f"'{n}'" for n in unused)
        print(f"zero_core: initialize was passed {objects}, which run{'s' if len(unused) == 1 else ''} instead of "
              f"the config's {sections} section{'s' if len(unused) > 1 else ''}, as DeepSpeed's engine does",
              flush=True)
    defaults = {"optimizer": ZeroConfig.model_fields["optimizer"].default, "scheduler": None}
    kept = cfg.model_copy(update={n: defaults[n] for n in unused})
    kept.model_fields_set.difference_update(unused)  # the optimizer section counts as not given
    return kept
