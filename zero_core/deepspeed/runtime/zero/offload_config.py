"""`deepspeed.runtime.zero.offload_config.OffloadDeviceEnum`: the `device` values of the config's
`offload_optimizer` / `offload_param` sections (a str enum: `OffloadDeviceEnum.cpu == "cpu"`)."""

from __future__ import annotations

from enum import Enum


class OffloadDeviceEnum(str, Enum):
    none = "none"
    cpu = "cpu"
    nvme = "nvme"
