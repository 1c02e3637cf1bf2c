"""A transformers model's blocks (what `compile: true` compiles and FSDP2 shards one by one) are its whole
repeated layers, also where `_no_split_modules` names only a part of one."""

from __future__ import annotations

import torch
import transformers

from zbench.models.factory import _hf_blocks


def test_longformer_blocks_are_its_layers_not_their_self_attention():
    cfg = transformers.LongformerConfig(hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
                                        intermediate_size=64, attention_window=8, vocab_size=100)
    model = transformers.LongformerForTokenClassification(cfg)
    assert set(model._no_split_modules) == {"LongformerSelfAttention"}  # the case this covers
    assert _hf_blocks(model) == list(model.longformer.encoder.layer)


def test_blocks_are_the_innermost_layers_holding_a_kept_module_and_never_a_list_of_parts():
    class Part(torch.nn.Linear):
        pass

    class Layer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.part = Part(2, 2)
            self.experts = torch.nn.ModuleList(torch.nn.Linear(2, 2) for _ in range(2))  # no kept module inside

    class Stage(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList(Layer() for _ in range(2))

    class Model(torch.nn.Module):
        _no_split_modules = ["Part"]

        def __init__(self) -> None:
            super().__init__()
            self.stages = torch.nn.ModuleList(Stage() for _ in range(2))

    model = Model()
    assert _hf_blocks(model) == [layer for stage in model.stages for layer in stage.layers]
