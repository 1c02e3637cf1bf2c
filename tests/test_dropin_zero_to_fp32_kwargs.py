"""`deepspeed.utils.zero_to_fp32` called with the keyword arguments DeepSpeed 0.19.8 takes (`max_shard_size=None`,
`exclude_frozen_parameters=True`, `convert_zero_checkpoint_to_state_dict(dtype=...)`) writes the files, entries
and dtypes DeepSpeed's writes for the same checkpoint (tests/fixtures/deepspeed_zero_to_fp32_kwargs.json, made by
tests/fixtures/make_dropin_zero_to_fp32.py), and the same values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from zero_core.deepspeed.utils import zero_to_fp32 as z

FIXTURES = Path(__file__).parent / "fixtures"
DEEPSPEED = json.loads((FIXTURES / "deepspeed_zero_to_fp32_kwargs.json").read_text())
CALLS = {
    "max_shard_size_none": lambda c, o: z.convert_zero_checkpoint_to_fp32_state_dict(c, o, max_shard_size=None),
    "exclude_frozen": lambda c, o: z.convert_zero_checkpoint_to_fp32_state_dict(c, o, exclude_frozen_parameters=True),
    "exclude_frozen_shards": lambda c, o: z.convert_zero_checkpoint_to_fp32_state_dict(
        c, o, max_shard_size=400, exclude_frozen_parameters=True),
    "dtype_bf16_name": lambda c, o: z.convert_zero_checkpoint_to_state_dict(c, o, dtype="bf16"),
    "dtype_fp16_torch": lambda c, o: z.convert_zero_checkpoint_to_state_dict(c, o, dtype=torch.float16),
    "dtype_torch_name": lambda c, o: z.convert_zero_checkpoint_to_state_dict(c, o, dtype="torch.BFloat16"),
}


def _listing(out: Path) -> dict:
    files = {}
    for f in sorted(out.iterdir()):
        if f.suffix == ".bin":
            state = torch.load(f, weights_only=True)
            files[f.name] = {k: str(v.dtype).removeprefix("torch.") for k, v in sorted(state.items())}
        else:
            files[f.name] = "index"
    return files


@pytest.mark.parametrize("case", ["2_3_fp32", "3_2_bf16"])
@pytest.mark.parametrize("call", sorted(CALLS))
def test_the_files_entries_and_dtypes_are_deepspeeds(tmp_path, case, call):
    src = FIXTURES / "deepspeed" / case
    CALLS[call](src, tmp_path / "out")
    assert _listing(tmp_path / "out") == DEEPSPEED[case][call]["files"]
    want = load_file(src / "expected_fp32.safetensors")  # DeepSpeed's own fp32 consolidation of this checkpoint
    for f in (tmp_path / "out").glob("*.bin"):
        for name, tensor in torch.load(f, weights_only=True).items():
            assert torch.equal(tensor, want[name].to(tensor.dtype)), name


@pytest.mark.parametrize("case", ["2_3_fp32", "3_2_bf16"])
def test_exclude_frozen_parameters_keeps_the_buffers_as_deepspeed(case):
    state = z.get_fp32_state_dict_from_zero_checkpoint(FIXTURES / "deepspeed" / case, exclude_frozen_parameters=True)
    assert sorted(state) == DEEPSPEED[case]["get_exclude_frozen"]  # `mix` is a buffer: kept; norm.weight is frozen


def test_an_output_dtype_deepspeed_does_not_take_is_a_value_error(tmp_path):
    assert DEEPSPEED["2_3_fp32"]["dtype_int8"] == {"raises": "ValueError"}
    with pytest.raises(ValueError, match="int8") as e:
        z.convert_zero_checkpoint_to_state_dict(FIXTURES / "deepspeed" / "2_3_fp32", tmp_path / "out", dtype="int8")
    assert "\n" not in str(e.value) and not (tmp_path / "out").exists()
