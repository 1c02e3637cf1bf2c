"""Lightning's `convert_zero_checkpoint_to_fp32_state_dict` for ZeroStrategy's checkpoint folders.

    from zero_core.integrations.lightning import convert_zero_checkpoint_to_fp32_state_dict
    convert_zero_checkpoint_to_fp32_state_dict("checkpoints/epoch=1.ckpt", "model.pt")
    model = MyLightningModule.load_from_checkpoint("model.pt")

As Lightning's own (lightning.pytorch.utilities.deepspeed), it writes with torch.save one dict: the checkpoint's
Lightning entries (epoch, global_step, loops, callbacks, hyper_parameters, ...) and "state_dict", the full fp32
weights under the LightningModule's names. The checkpoint is read with zbench's readers: a ZeroStrategy folder
(its Lightning entries are JSON data in the manifest) or one of Lightning's DeepSpeedStrategy (read as plain
data, nothing imported or run); nothing is unpickled beyond that.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from checkpoints.detect import open_source, resolve
from checkpoints.source import full_state_dict

from ..client_state_codec import decode as decode_client_state


def convert_zero_checkpoint_to_fp32_state_dict(
    checkpoint_dir: str | os.PathLike, output_file: str | os.PathLike, tag: str | None = None
) -> dict[str, Any]:
    """Write `output_file` (torch.save) from the checkpoint folder `checkpoint_dir` (`tag`: a tag folder in it,
    else the one `latest` names) and return what was written: the Lightning entries and "state_dict"."""
    folder, kind = resolve(checkpoint_dir, tag)
    if kind not in ("zbench", "deepspeed"):
        raise ValueError(
            f"{folder} is a {kind} checkpoint, not one of ZeroStrategy or Lightning's DeepSpeedStrategy; read its "
            "weights with `zbench convert` instead"
        )
    source = open_source(folder)
    if kind == "zbench":
        extras = dict(decode_client_state(source.manifest, source.folder))
    else:  # DeepSpeed's model-states file: what Lightning passed as client_state
        extras = dict(source.model.client_state)
    weights = full_state_dict(source)
    # checkpoints of Lightning < 2.1 name the weights under its wrapper; Lightning's converter drops that prefix too
    extras["state_dict"] = {name.removeprefix("_forward_module."): t for name, t in weights.items()}
    torch.save(extras, os.fspath(output_file))
    return extras
