"""The processes Trainer counts against the processes launched.

Trainer on a machine without GPUs counts one process unless `TrainingArguments(use_cpu=True)`, even under
`torchrun --nproc_per_node 2`: it would hand every process the whole dataset and fill "auto" batch sizes for one,
while the engine reduces gradients over all of them (transformers on DeepSpeed trains that way, then fails in a
gather). Refused before the engine is built, naming the argument that fixes it.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist


def refuse_unsplit_launch(args: Any) -> None:
    launched = dist.get_world_size() if dist.is_available() and dist.is_initialized() else args.world_size
    if launched != args.world_size:
        raise ValueError(
            f"TrainingArguments count {args.world_size} process(es) but {launched} were launched, so Trainer would "
            "not split the data between them; on a machine without GPUs pass TrainingArguments(use_cpu=True)"
        )
