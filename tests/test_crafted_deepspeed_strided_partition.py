"""A DeepSpeed optimizer-states file whose fp32 partition is stored as a strided view (stride 0: one element
repeated) is refused in one line when the checkpoint is opened, so `zbench inspect` says what `convert` and the
resume would say, rather than "integrity ok" (the zip's CRCs cover the stored bytes, not the view over them)."""

from __future__ import annotations

import pickletools

import pytest

from checkpoints.deepspeed_source import DeepSpeedSource
from deepspeed_crafting import crafted, opcode, refuses, rewrite_pickle

OPTIM = "zero_pp_rank_1_mp_rank_00_optim_states.pt"


def _zero_stride(key: str):
    """The pickle of the first tensor after the string `key` rebuilt with stride (0,) instead of (1,)."""

    def change(data: bytes) -> bytes:
        ops = list(pickletools.genops(data))
        at = next(k for k, (op, arg, _) in enumerate(ops) if arg == key and "UNICODE" in op.name)
        storage = next(k for k in range(at, len(ops)) if ops[k][0].name == "BINPERSID")  # then offset, size, stride
        size, stride = [k for k in range(storage, len(ops)) if ops[k][0].name == "TUPLE1"][:2]
        k = stride - 1  # the stride's one element
        return data[: ops[k][2]] + opcode(0) + data[ops[k + 1][2]:]

    return change


@pytest.mark.parametrize("fixture, key", [("2_2_fp32", "single_partition_of_fp32_groups"),
                                          ("3_2_fp32", "fp32_flat_groups")])
def test_a_strided_partition_is_refused_on_open(tmp_path, fixture, key):
    tag = crafted(tmp_path, fixture)
    assert DeepSpeedSource(tag).world_size == 2  # as saved: it opens
    rewrite_pickle(tag / OPTIM, _zero_stride(key))
    refuses(tag, OPTIM, key, "strides (0,)", "corrupt")
