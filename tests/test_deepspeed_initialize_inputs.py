"""What `deepspeed.initialize` takes and gives back as DeepSpeed 0.19.8 does: its `training_data` loader (a
DeepSpeedDataLoader with its `data_sampler`, which `iter()` returns itself), `engine.deepspeed_io`, and
`config` preferred to `config_params` when a script passes both."""

from __future__ import annotations

import pytest
import torch

import zero_core.deepspeed as deepspeed

CONFIG = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
          "dataloader_drop_last": True}
# DeepSpeed 0.19.8 on CPU, one rank: initialize(training_data=DATA, collate_fn=_collate) with CONFIG's loader over
# 10 samples: each batch of a pass, again after data_sampler.set_epoch(1), and deepspeed_io(route="eval")'s
DS_FIRST = [[40.0, 10.0, 70.0, 50.0], [30.0, 90.0, 0.0, 80.0]]
DS_EPOCH1 = [[50.0, 60.0, 10.0, 20.0], [0.0, 80.0, 90.0, 30.0]]
DS_EVAL = [[0.0, 10.0, 20.0], [30.0, 40.0, 50.0], [60.0, 70.0, 80.0]]
DATA = [torch.tensor([float(i)]) for i in range(10)]


def _collate(items: list) -> torch.Tensor:
    return torch.cat(items) * 10


def test_training_data_gives_deepspeeds_loader_and_batches():
    model = torch.nn.Linear(1, 1)
    engine, _, loader, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=CONFIG,
                                                training_data=DATA, collate_fn=_collate)
    assert isinstance(loader, deepspeed.runtime.dataloader.DeepSpeedDataLoader) and engine.training_dataloader is loader
    assert len(loader) == 2 and isinstance(loader.data_sampler, torch.utils.data.DistributedSampler)
    assert [b.tolist() for b in loader] == DS_FIRST
    loader.data_sampler.set_epoch(1)  # a script's per-epoch reshuffle
    it = iter(loader)
    assert it is loader and next(it).tolist() == DS_EPOCH1[0] and next(it).tolist() == DS_EPOCH1[1]
    with pytest.raises(StopIteration):
        next(it)
    evaluation = engine.deepspeed_io(DATA, batch_size=3, route="eval")  # in order; the collate_fn by default
    assert [b.tolist() for b in evaluation] == DS_EVAL and len(evaluation) == 3
    engine.close()


def test_deepspeed_io_refuses_what_it_cannot_deal_over_ranks():
    model = torch.nn.Linear(1, 1)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=CONFIG)
    with pytest.raises(ValueError, match="needs a map-style dataset") as e:
        engine.deepspeed_io(iter(DATA))
    assert "\n" not in str(e.value)
    engine.close()


def test_config_is_taken_over_config_params_as_deepspeed_takes_it():
    model = torch.nn.Linear(1, 1)
    other = {**CONFIG, "train_micro_batch_size_per_gpu": 3}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=CONFIG,
                                      config_params=other)
    assert engine.train_micro_batch_size_per_gpu() == 4
    engine.close()
