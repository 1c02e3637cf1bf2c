"""DeepSpeed's data loading on the engine: `engine.deepspeed_io(dataset)`, which `deepspeed.initialize` also calls
for its `training_data`, giving the `DeepSpeedDataLoader` DeepSpeed gives (each rank its share of the data, as
DeepSpeed's DistributedSampler deals it, a micro-batch per batch)."""

from __future__ import annotations

from typing import Any

import torch

ROUTE_TRAIN, ROUTE_EVAL, ROUTE_PREDICT, ROUTE_ENCODE = "train", "eval", "predict", "encode"  # DeepSpeed's routes


def is_map_style(data: Any) -> bool:
    """Indexable and sized, as a DistributedSampler needs to deal it over the ranks."""
    return hasattr(data, "__getitem__") and hasattr(data, "__len__")


class EngineDataLoader:
    """Mixed into the engine."""

    collate_fn: Any = None  # deepspeed.initialize(collate_fn=...): deepspeed_io's default

    def deepspeed_io(self, dataset: Any, batch_size: int | None = None, route: str = ROUTE_TRAIN,
                     pin_memory: bool = True, data_sampler: Any = None, collate_fn: Any = None,
                     num_local_io_workers: int | None = None) -> Any:
        """A DeepSpeedDataLoader over `dataset`: `batch_size` (the micro-batch) samples a batch, this rank's share
        dealt by a DistributedSampler over the ranks (shuffled for training, in order for `route` "eval" or
        "predict") unless `data_sampler` is given; the config's `dataloader_drop_last` drops a last short batch."""
        from .deepspeed.runtime.dataloader import DeepSpeedDataLoader

        if data_sampler is None and not is_map_style(dataset):
            raise ValueError(f"deepspeed_io needs a map-style dataset (indexable, with a length) to deal over the "
                             f"ranks, got {type(dataset).__name__}; wrap the data in a torch.utils.data.Dataset, or "
                             "pass data_sampler= (an IterableDataset: build its DataLoader yourself)")
        if data_sampler is None and route in (ROUTE_EVAL, ROUTE_PREDICT):
            data_sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=self.world_size, rank=self.rank,
                                                               shuffle=False)
        return DeepSpeedDataLoader(
            dataset, batch_size if batch_size is not None else self.train_micro_batch_size_per_gpu(),
            pin_memory=pin_memory and self.device.type == "cuda", local_rank=self.local_rank,
            collate_fn=collate_fn if collate_fn is not None else self.collate_fn,
            num_local_io_workers=num_local_io_workers, data_sampler=data_sampler,
            data_parallel_world_size=self.world_size, data_parallel_rank=self.rank,
            dataloader_drop_last=bool(self.config.dataloader_drop_last))
