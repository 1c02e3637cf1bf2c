"""Copies of the DeepSpeed fixtures with rewritten fields: every scalar the readers take from model- and
optimizer-states files is type- and range-checked where it is read (one CheckpointError line naming the file, the
field and the value), and a world size costs work bounded by the rank files present."""

from __future__ import annotations

import shutil

import pytest

from checkpoint_helpers import DEEPSPEED
from checkpoints import deepspeed_layout as layout
from checkpoints.deepspeed_pickle import load_pickle
from checkpoints.deepspeed_source import DeepSpeedSource
from checkpoints.deepspeed_universal_source import UniversalSource
from checkpoints.source import CheckpointError
from deepspeed_crafting import crafted, patch, refuses, resave, rewrite_pickle
from helpers import FIXTURES, refused

MODEL = "mp_rank_00_model_states.pt"


@pytest.mark.parametrize(
    "key, value, shown",
    [
        ("dp_world_size", -1, "-1"),
        ("dp_world_size", 0, "0"),
        ("dp_world_size", "abc", "'abc'"),
        ("dp_world_size", True, "True"),
        ("dp_world_size", 1.5, "1.5"),
        ("dp_world_size", 10**12, "1000000000000"),
        ("dp_world_size", 10**40, "an integer of 133 bits"),
        ("global_steps", -1, "-1"),
        ("global_steps", "abc", "'abc'"),
        ("skipped_steps", "abc", "'abc'"),
        ("skipped_steps", -1, "-1"),
        ("lr_scheduler", "abc", "'abc'"),
        ("ds_version", 5, "5"),
        ("ds_version", "x" * 100, "'" + "x" * 40 + "'..."),  # cut short in the message
        ("enabled", "abc", "'abc'"),  # ds_config.bf16.enabled
        ("stage", 7, "7"),  # ds_config.zero_optimization.stage
    ],
)
def test_model_states_scalar_fields(tmp_path, key, value, shown):
    tag = crafted(tmp_path, "2_2_bf16")
    patch(tag / MODEL, key, value)
    refuses(tag, MODEL, f"{key} is {shown}", "copy it again")


def _paths_looked_at(monkeypatch) -> list:
    """The rank-file names the readers build paths for from here on (through checkpoints/paths.py's inside)."""
    import checkpoints.deepspeed_model_states as states
    import checkpoints.deepspeed_source as source

    looked = []
    for module in (states, source):
        inside = module.__dict__.get("inside")
        if inside is not None:
            monkeypatch.setattr(module, "inside", lambda *a, _f=inside, **k: looked.append(a[1]) or _f(*a, **k))
    return looked


def test_world_size_beyond_the_rank_files_present(tmp_path, monkeypatch):
    """A world size of 2**20 beside 2 rank files: the paths looked at stop at the first one absent."""
    tag = crafted(tmp_path, "2_2_bf16")
    patch(tag / MODEL, "dp_world_size", 1 << 20)
    looked = _paths_looked_at(monkeypatch)
    refuses(tag, "missing rank file", f"bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt (world size {1 << 20})")
    assert len(looked) < 10, len(looked)


def test_world_size_bounded_by_the_files_not_their_names(tmp_path):
    """Without dp_world_size the rank files say the world size: a huge rank in a name builds no list that long."""
    tag = crafted(tmp_path, "2_2_bf16")
    patch(tag / MODEL, "dp_world_size", None)
    rank1 = tag / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    rank1.rename(tag / "bf16_zero_pp_rank_1000000000000_mp_rank_00_optim_states.pt")
    refuses(tag, "missing rank file", rank1.name, "world size 2")


@pytest.mark.parametrize("value, words", [(10**12, "dp_world_size is 1000000000000"),
                                          (1 << 20, "zero_pp_rank_2_mp_rank_00_model_states.pt (world size 1048576)")])
def test_zero3_world_size_bounded_by_its_model_states_files(tmp_path, monkeypatch, value, words):
    tag = crafted(tmp_path, "3_2_fp32")
    patch(tag / "zero_pp_rank_0_mp_rank_00_model_states.pt", "dp_world_size", value)
    looked = _paths_looked_at(monkeypatch)
    refuses(tag, words)
    assert len(looked) < 10, len(looked)


def test_universal_model_states_fields(tmp_path):
    tag = crafted(tmp_path, "2_2_bf16", FIXTURES / "deepspeed_universal")
    patch(tag / MODEL, "stage", "auto")
    refuses(tag, MODEL, "ds_config.zero_optimization.stage is 'auto'", opener=UniversalSource)
    patch(tag / MODEL, "dp_world_size", 10**12)  # no rank files beside: the bound is a fixed one
    refuses(tag, MODEL, "dp_world_size is 1000000000000", opener=UniversalSource)


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"param_shapes": [{"emb.weight": (-11, 7)}]}, "param_shapes[0]['emb.weight'] is -11"),
        ({"param_shapes": [{"emb.weight": (11, "7")}]}, "param_shapes[0]['emb.weight'] is '7'"),
        ({"param_shapes": [{"emb.weight": (2**40, 2**40)}]}, "a shape of at most"),
        ({"param_shapes": "abc"}, "param_shapes is 'abc'"),
        ({"frozen_param_shapes": {"norm.weight": 13}}, "frozen_param_shapes['norm.weight'] is 13"),
        ({"shared_params": {"head.weight": 3}}, "shared_params is a dict, not a dict of names"),
        ({"buffer_names": "mix"}, "buffer_names is 'mix', not a list of names"),
        ({"frozen_param_fragments": {"norm.weight": 1.0}}, "frozen_param_fragments['norm.weight'] is 1.0"),
        ({"ds_config": {"fp16": "on"}}, "ds_config.fp16 is 'on'"),
    ],
)
def test_model_states_shapes_and_names(tmp_path, changes, words):
    tag = crafted(tmp_path, "2_2_fp32")
    resave(tag / MODEL, **changes)
    refuses(tag, MODEL, words)


@pytest.mark.parametrize(
    "key, value, words",
    [
        ("zero_stage", "abc", "zero_stage is 'abc', not an integer in [1, 3]"),
        ("zero_stage", True, "zero_stage is True"),
        ("zero_stage", 0, "ZeRO stage 0 checkpoints are not supported"),
        ("numel", -5, "param_slice_mappings[0]['lin1.weight'].numel is -5"),
        ("numel", "abc", ".numel is 'abc'"),
        ("start", 1.5, "param_slice_mappings[0]['lin1.weight'].start is 1.5"),
    ],
)
def test_optimizer_states_fields(tmp_path, key, value, words):
    tag = crafted(tmp_path, "2_2_bf16")
    victim = tag / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    patch(victim, key, value)
    refuses(tag, victim.name, words)


def test_param_groups_out_of_step_with_the_partitions(tmp_path):
    tag = crafted(tmp_path, "2_2_fp32")
    shapes = load_pickle(tag / MODEL, mmap=False)["param_shapes"][0]
    names = list(shapes)
    resave(tag / MODEL, param_shapes=[{n: shapes[n] for n in names[:2]}, {n: shapes[n] for n in names[2:]}])
    refuses(tag, "zero_pp_rank_0_mp_rank_00_optim_states.pt: single_partition_of_fp32_groups holds 1 partitions",
            "has 2 param groups")


def test_zero3_frozen_fragment_missing_from_a_rank_file(tmp_path):
    tag = crafted(tmp_path, "3_2_fp32")
    victim = tag / "zero_pp_rank_1_mp_rank_00_model_states.pt"
    resave(victim, frozen_param_fragments={"norm.weight": "abc"})
    words = f"{victim.name}: frozen_param_fragments['norm.weight'] is 'abc', not a tensor"
    refuses(tag, words, opener=lambda folder: DeepSpeedSource(folder).load("norm.weight"))


def test_zero_stage_differs_between_rank_files(tmp_path):
    tag = crafted(tmp_path, "2_2_bf16")
    victim = tag / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    patch(victim, "zero_stage", 1)
    refuses(tag, victim.name, "zero_stage is 1, not 2, as in the other rank files")


@pytest.mark.parametrize("value", [-3, "abc", 2.0])
def test_alignment_paddings_where_no_slice_mappings(tmp_path, value):
    """Older DeepSpeed saves no param_slice_mappings: the paddings place the parameters, so they are checked."""
    tag = crafted(tmp_path, "2_2_bf16")
    for f in tag.glob("*_optim_states.pt"):
        rewrite_pickle(f, lambda data: data.replace(b"param_slice_mappings", b"param_slice_mappingz"))
    assert DeepSpeedSource(tag).load("emb.weight").shape == (11, 7)  # the offset arithmetic on its own
    victim = tag / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"
    patch(victim, "param_alignment_paddings", value)
    refuses(tag, victim.name, f"param_alignment_paddings[0][0] is {value!r}")


@pytest.mark.parametrize(
    "key, value, words",
    [
        ("cur_scale", float("nan"), "loss_scaler.cur_scale is nan, not a finite number"),
        ("cur_scale", 0.0, "loss_scaler.cur_scale is 0.0"),
        ("cur_scale", 1e300, "loss_scaler.cur_scale is 1e+300"),
        ("cur_scale", "abc", "loss_scaler.cur_scale is 'abc'"),
        ("cur_iter", -5, "loss_scaler.cur_iter is -5"),
        ("cur_iter", 4.0, "loss_scaler.cur_iter is 4.0, not an integer"),
        ("last_overflow_iter", -2, "loss_scaler.last_overflow_iter is -2"),
        ("cur_hysteresis", 0, "loss_scaler.cur_hysteresis is 0"),
        ("dynamic", "yes", "loss_scaler.dynamic is 'yes', not true or false"),
    ],
)
def test_loss_scaler_fields(tmp_path, key, value, words):
    tag = crafted(tmp_path, "2", FIXTURES / "deepspeed_fp16")
    assert DeepSpeedSource(tag).loss_scaler()["cur_scale"] == 512.0
    victim = tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    patch(victim, key, value)
    refuses(tag, victim.name, words, opener=lambda folder: DeepSpeedSource(folder).loss_scaler())


def test_skipped_steps_up_to_the_steps_taken(tmp_path):
    """The edge of the range loads (and 1 reads as true, as in DeepSpeed's config); one past it is refused."""
    tag = crafted(tmp_path, "2_2_bf16")
    patch(tag / MODEL, "skipped_steps", 2)
    patch(tag / MODEL, "enabled", 1)
    src = DeepSpeedSource(tag)
    assert (src.model.skipped, src.model.step, src.model.precision, src.world_size) == (2, 2, "bf16", 2)
    patch(tag / MODEL, "skipped_steps", 3)
    refuses(tag, MODEL, "skipped_steps is 3, not an integer in [0, 2]")


@pytest.mark.parametrize(
    "key, value, words",
    [("dp_world_size", 10**12, "dp_world_size is 1000000000000"), ("skipped_steps", "abc", "skipped_steps is 'abc'"),
     ("dp_world_size", -1, "dp_world_size is -1")],
)
def test_cli_convert_and_inspect_one_line(tmp_path, key, value, words):
    src = next(p for p in DEEPSPEED if p.name == "2_2_bf16")
    shutil.copytree(src, tmp_path / "ck")
    patch(tmp_path / "ck" / "global_step2" / MODEL, key, value)
    for cmd in (["convert", tmp_path / "ck", "--to", "fp32", "--out", tmp_path / "out"], ["inspect", tmp_path / "ck"]):
        line = refused(tmp_path, *cmd)
        assert MODEL in line and words in line, line
    assert not (tmp_path / "out").exists()


def test_cli_universal_inspect_one_line(tmp_path):
    tag = crafted(tmp_path, "3_2_fp32", FIXTURES / "deepspeed_universal")
    patch(tag / "zero_pp_rank_0_mp_rank_00_model_states.pt", "skipped_steps", -1)
    line = refused(tmp_path, "inspect", tag)
    assert "zero_pp_rank_0_mp_rank_00_model_states.pt: skipped_steps is -1" in line, line


def test_a_negative_piece_is_refused_though_the_sizes_add_up():
    pieces = {"w": [layout.Piece(0, 0, 8), layout.Piece(1, 0, -4)]}
    with pytest.raises(CheckpointError, match="w reaches past the fp32 partition of rank 1"):
        layout.check_pieces(pieces, {"w": (4,)}, [8, 8], "crafted")


@pytest.mark.parametrize("value, words", [
    (5, "exp_avg of group 0 holds 130 elements for an fp32 partition of 129 (padding 5); the file is damaged"),
    ("abc", "group_paddings[0] is 'abc'"),
    (-1, "group_paddings[0] is -1"),
])
def test_moment_padding_beyond_the_partition(tmp_path, value, words):
    """Two param groups at ZeRO-2: rank 1's moments carry DeepSpeed's alignment padding (group_paddings [1, 3]),
    its fp32 partitions do not; any other difference is a damaged file, said in one line."""
    tag = crafted(tmp_path, "2_2_fp32_groups")
    victim = tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    DeepSpeedSource(tag).check_states(("exp_avg", "exp_avg_sq"))  # as saved: the padding is DeepSpeed's own
    patch(victim, "group_paddings", value)
    with pytest.raises(CheckpointError) as e:
        DeepSpeedSource(tag).check_states(("exp_avg", "exp_avg_sq"))
    line = str(e.value)
    assert "\n" not in line and victim.name in line and words in line, line

