"""A folder of weights that are already whole (Accelerate's save_state without DeepSpeed or FSDP writes
`model.safetensors` beside `optimizer.bin`; save_pretrained writes `model.safetensors` or `pytorch_model.bin`) is no
sharded checkpoint: `zbench inspect` and `zbench convert` say so in one line with the fix (load it directly) rather
than asking for the folder that holds the checkpoint files."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from helpers import read_command, refused


@pytest.mark.parametrize("weights", ["model.safetensors", "pytorch_model.bin"])
@pytest.mark.parametrize("command", ["inspect", "convert"])
def test_whole_weights_are_named_with_the_fix(tmp_path, command, weights):
    folder = tmp_path / "src" / "state"
    folder.mkdir(parents=True)
    tensors = {"lin.weight": torch.ones(2, 3)}
    if weights.endswith(".safetensors"):
        save_file(tensors, str(folder / weights))
    else:
        torch.save(tensors, folder / weights)
    torch.save({"state": {}, "param_groups": []}, folder / "optimizer.bin")
    line = refused(tmp_path, *read_command(command, folder, tmp_path / "out"))
    assert f"it holds {weights}, weights that are already whole" in line and "no conversion is needed" in line
    assert not (tmp_path / "out").exists()

