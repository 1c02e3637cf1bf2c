"""`deepspeed.checkpoint.constants`: the key and file names of DeepSpeed's ZeRO checkpoints, for scripts that read
or write DeepSpeed's files by hand (zbench's own checkpoints are laid out otherwise: docs/checkpoints.md).
Keys of DeepSpeed's parallel and universal conversion tools are refused in one line naming `zbench convert`."""

from __future__ import annotations

from ..refused import refusing_getattr

# the optimizer-state file's keys
OPTIMIZER_STATE_DICT = "optimizer_state_dict"
BASE_OPTIMIZER_STATE = "base_optimizer_state"
BASE_OPTIMIZER_STATE_STEP = "base_optimizer_state_step"
FP32_GROUPS = "fp32_groups"
FP32_FLAT_GROUPS = "fp32_flat_groups"  # stage 3's fp32 partitions
SINGLE_PARTITION_OF_FP32_GROUPS = "single_partition_of_fp32_groups"  # stages 1-2's
PARAM_GROUPS = "param_groups"
GROUP_PADDINGS = "group_paddings"
PARAM_ALIGNMENT_PADDINGS = "param_alignment_paddings"
PARTITION_COUNT = "partition_count"
ZERO_STAGE = "zero_stage"
CLIP_GRAD = "clip_grad"
FP32_WEIGHT_KEY = "fp32"
LOSS_SCALER = "loss_scaler"

# the model-state file's keys
PARAM = "param"
PARAM_SHAPES = "param_shapes"
BUFFER_NAMES = "buffer_names"
FROZEN_PARAM_SHAPES = "frozen_param_shapes"
FROZEN_PARAM_FRAGMENTS = "frozen_param_fragments"
DS_VERSION = "ds_version"

# file names in a tag's folder
MODEL_FILE_PREFIX = "mp_rank_"
ZERO_FILE_PREFIX = "zero_pp_rank_"
BF16_ZERO_FILE_PREFIX = "bf16_" + ZERO_FILE_PREFIX
FP16_ZERO_FILE_PREFIX = "fp16_" + ZERO_FILE_PREFIX
OPTIM_FILE_SUFFIX = "_optim_states.pt"
MODEL_FILE_SUFFIX = "_model_states.pt"
LAYER_FILE_PREFIX = "layer_"

# the parallel layout and universal-checkpoint markers a saved state carries
CHECKPOINT_PARALLEL_DIMS = "checkpoint_parallel_dimensions"
CHECKPOINT_PP_DEGREE = "pp_degree"
CHECKPOINT_TP_DEGREE = "tp_degree"
UNIVERSAL_CHECKPOINT_INFO = "universal_checkpoint_info"
UNIVERSAL_CHECKPOINT_VERSION_KEY = "universal_checkpoint_version"
UNIVERSAL_CHECKPOINT_VERSION_VALUE = 0.4


_CONVERT = ("it names a key of DeepSpeed's checkpoint conversion tools; convert DeepSpeed checkpoints with "
            "`zbench convert DIR --to fp32` (docs/checkpoints.md)")


def __getattr__(name: str) -> object:
    """Any other upper-case name is a key of DeepSpeed's own conversion tools (universal, expert, folding)."""
    return refusing_getattr(__name__, {name: _CONVERT} if name.isupper() and name[0] != "_" else {})(name)
