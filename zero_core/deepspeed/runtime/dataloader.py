"""`deepspeed.runtime.dataloader`: `RepeatingLoader` (also `deepspeed.utils.RepeatingLoader`) and
`DeepSpeedDataLoader`."""

from __future__ import annotations

from typing import Any, Iterable, Iterator


class RepeatingLoader:
    """Iterates `loader` without end: starts it again each time it is exhausted (a new epoch for a
    DataLoader whose sampler shuffles)."""

    def __init__(self, loader: Iterable[Any]) -> None:
        self.loader = loader
        self.data_iter = iter(loader)

    def __iter__(self) -> "RepeatingLoader":
        return self

    def __next__(self) -> Any:
        try:
            return next(self.data_iter)
        except StopIteration:
            self.data_iter = iter(self.loader)
            return next(self.data_iter)  # an empty loader ends here, as it would have anyway


class DeepSpeedDataLoader:
    """DeepSpeed's data-parallel loader (what `initialize(training_data=...)` and `engine.deepspeed_io` build): a
    torch DataLoader (`.dataloader`) over `dataset` whose sampler (`.data_sampler`, a DistributedSampler over the
    data-parallel ranks unless `data_sampler` is given) gives each rank its share, `batch_size` samples a batch.
    As DeepSpeed's, `iter(loader)` starts a pass and returns the loader itself, which `next()` then reads.
    Curriculum learning and the throughput timer that DeepSpeed's takes are not provided (`tput_timer` and
    `deepspeed_dataloader_config` are accepted, unused); no worker processes unless `num_local_io_workers`."""

    def __init__(self, dataset: Any, batch_size: int, pin_memory: bool = False, local_rank: int = 0,
                 tput_timer: Any = None, collate_fn: Any = None, num_local_io_workers: int | None = None,
                 data_sampler: Any = None, data_parallel_world_size: int | None = None,
                 data_parallel_rank: int | None = None, dataloader_drop_last: bool = False,
                 deepspeed_dataloader_config: dict | None = None) -> None:
        import torch
        import torch.distributed as dist

        if data_sampler is None:
            world = data_parallel_world_size or (dist.get_world_size() if dist.is_initialized() else 1)
            rank = data_parallel_rank if data_parallel_rank is not None else (
                dist.get_rank() if dist.is_initialized() else 0)
            data_sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=world, rank=rank)
        self.dataset, self.batch_size, self.data_sampler = dataset, batch_size, data_sampler
        self.collate_fn, self.pin_memory, self.dataloader_drop_last = collate_fn, pin_memory, dataloader_drop_last
        self.num_local_io_workers = num_local_io_workers or 0
        self.post_process_func = None  # DeepSpeed's hook for curriculum learning, which is not provided
        self.dataloader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, sampler=data_sampler,
                                                      collate_fn=collate_fn, pin_memory=pin_memory,
                                                      num_workers=self.num_local_io_workers,
                                                      drop_last=dataloader_drop_last)
        self.len = len(self.dataloader)
        self.data: Iterator[Any] | None = None

    def __iter__(self) -> "DeepSpeedDataLoader":
        self.data = iter(self.dataloader)
        return self

    def __next__(self) -> Any:
        if self.data is None:  # DeepSpeed's fails here; starting the pass is what such a script means
            self.data = iter(self.dataloader)
        return next(self.data)

    def __len__(self) -> int:
        return self.len
