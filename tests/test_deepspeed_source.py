"""DeepSpeed ZeRO-1/2/3 and universal checkpoints read without DeepSpeed match DeepSpeed's own consolidation."""

from __future__ import annotations

import math
import shutil
import sys
import types

import pytest
import torch
from hypothesis import given, settings, strategies as st
from safetensors import safe_open
from safetensors.torch import load_file

from checkpoint_helpers import DEEPSPEED, UNIVERSAL
from checkpoints import deepspeed_layout as layout
from checkpoints.deepspeed_pickle import FragmentAddress, load_pickle
from checkpoints.deepspeed_source import DeepSpeedSource
from checkpoints.deepspeed_universal_source import UniversalSource
from checkpoints.detect import open_source
from checkpoints.source import CheckpointError

pytestmark = pytest.mark.slow  # spawned ranks or whole runs: outside the fast tier (-m 'not slow')


def _expected(folder):
    with safe_open(str(folder / "expected_fp32.safetensors"), "pt") as f:
        from_model = [n for n in f.metadata()["frozen_from_model"].split(",") if n]
    return load_file(folder / "expected_fp32.safetensors"), from_model


@pytest.mark.parametrize("folder", DEEPSPEED, ids=lambda p: p.name)
def test_matches_deepspeed_consolidation_bitwise(folder):
    stage, world, dtype = folder.name.split("_")[:3]
    src = open_source(folder)
    assert isinstance(src, DeepSpeedSource)
    assert (src.stage, src.world_size, src.precision) == (int(stage), int(world), dtype)
    expected, from_model = _expected(folder)
    infos = {i.name: i for i in src.params()}
    assert set(infos) == set(expected)
    for name, want in expected.items():
        got = src.load(name)
        assert got.dtype == torch.float32 and got.shape == want.shape
        # DeepSpeed hands frozen fragments back in the run's dtype; bf16 -> fp32 is exact
        assert torch.equal(got, want.float()), name
    assert infos["norm.weight"].trainable is False  # the frozen parameter is there...
    assert from_model == (["norm.weight"] if stage == "1" else [])  # ...though DeepSpeed drops it for ZeRO-1
    assert infos["head.weight"].tied_to == "emb.weight"
    assert src.verify() == []


@pytest.mark.parametrize("folder", DEEPSPEED, ids=lambda p: p.name)
def test_masters_round_to_the_model_weights(folder):
    """The run's own (fp32 or bf16) weights at save time are our fp32 masters cast to the run's dtype."""
    src = open_source(folder)
    for name, want in load_file(folder / "expected_model.safetensors").items():
        assert torch.equal(src.load(name).to(want.dtype), want), name


@pytest.mark.parametrize("folder", [p for p in DEEPSPEED if not p.name.startswith("3")], ids=lambda p: p.name)
def test_slice_mappings_agree_with_offset_arithmetic(folder):
    src = open_source(folder)
    metas = [load_pickle(f)["optimizer_state_dict"] for f in src.optim_files]
    sizes = [[t.numel() for t in m["single_partition_of_fp32_groups"]] for m in metas]
    by_mappings = layout.stage12_from_mappings([m["param_slice_mappings"] for m in metas], sizes)
    by_offsets = layout.stage12_from_offsets(src.model.param_shapes, metas[0]["param_alignment_paddings"], sizes)
    assert by_mappings == by_offsets


@pytest.mark.parametrize("folder", UNIVERSAL, ids=lambda p: p.name)
def test_universal_matches_deepspeed_consolidation(folder):
    src = open_source(folder)
    assert isinstance(src, UniversalSource)
    expected, _ = _expected(folder.parents[1] / "deepspeed" / folder.name)
    assert {i.name for i in src.params()} == set(expected)
    for name, want in expected.items():
        assert torch.equal(src.load(name), want.float()), name
    s = src.summary()
    assert (s.kind, s.step, s.stage, s.world_size) == ("deepspeed-universal", 2, int(folder.name[0]), 2)
    assert src.verify() == []


def _gather(pieces, rank_groups, numel):
    flat = [torch.cat(g) if g else torch.empty(0) for g in rank_groups]
    return torch.cat([flat[p.rank][p.start : p.start + p.numel] for p in pieces] or [torch.empty(0)])[:numel]


@settings(max_examples=60, deadline=None)
@given(
    world=st.integers(1, 4),
    groups=st.lists(
        st.lists(st.tuples(st.integers(0, 40), st.integers(0, 3)), min_size=1, max_size=5), min_size=1, max_size=3
    ),
)
def test_stage12_layout_against_a_simulated_deepspeed_flat_buffer(world, groups):
    """Flatten as ZeRO-1/2 does (per-param padding, tail aligned to 2*world, even split, saved tails trimmed)."""
    shapes, paddings, params, rank_groups, mappings = [], [], {}, [[] for _ in range(world)], [[] for _ in range(world)]
    for g, spec in enumerate(groups):
        names = {f"g{g}.p{i}": (n,) for i, (n, _) in enumerate(spec)}
        pads = [pad for _, pad in spec[:-1]] + [0]  # DeepSpeed never pads after the last parameter
        chunks, offsets, pos = [], {}, 0
        for (name, shape), pad in zip(names.items(), pads):
            params[name] = torch.randn(shape)
            offsets[name] = pos
            chunks += [params[name], torch.zeros(pad)]
            pos += shape[0] + pad
        align = 2 * world
        flat = torch.cat(chunks + [torch.zeros(-pos % align)])
        part = flat.numel() // world
        for r in range(world):
            kept = min(part, max(0, pos - r * part))  # DeepSpeed saves partitions without the group's tail padding
            rank_groups[r].append(flat[r * part : r * part + kept])
            frags = {}
            for name, shape in names.items():
                lo, hi = max(offsets[name], r * part), min(offsets[name] + shape[0], (r + 1) * part)
                if lo < hi:
                    frags[name] = FragmentAddress(numel=hi - lo, start=lo - r * part)
            mappings[r].append(frags)
        shapes.append(names)
        paddings.append(pads)
    sizes = [[t.numel() for t in groups_r] for groups_r in rank_groups]
    by_offsets = layout.stage12_from_offsets(shapes, paddings, sizes)
    assert {k: v for k, v in by_offsets.items() if v} == layout.stage12_from_mappings(
        mappings, sizes
    )  # no fragment for empty params
    layout.check_pieces(by_offsets, {n: s for g in shapes for n, s in g.items()}, [sum(s) for s in sizes], "sim")
    for name, t in params.items():
        assert torch.equal(_gather(by_offsets[name], rank_groups, t.numel()), t)


@settings(max_examples=40, deadline=None)
@given(world=st.integers(1, 4), numels=st.lists(st.integers(0, 30), min_size=1, max_size=6), cut=st.integers(0, 50))
def test_stage3_layout_against_simulated_partitions(world, numels, cut):
    params = {f"p{i}": torch.randn(n) for i, n in enumerate(numels)}
    rank_flat = [[] for _ in range(world)]
    for t in params.values():
        part = math.ceil(t.numel() / world)
        padded = torch.cat([t, torch.zeros(part * world - t.numel())])
        for r in range(world):
            rank_flat[r].append(padded[r * part : (r + 1) * part])
    rank_groups = []
    for chunks in rank_flat:  # split each rank's partitions into two sub-groups at an arbitrary point
        flat = torch.cat(chunks) if chunks else torch.empty(0)
        c = min(cut, flat.numel())
        rank_groups.append([flat[:c], flat[c:]])
    pieces = layout.stage3_pieces([{n: tuple(t.shape) for n, t in params.items()}], world)
    for name, t in params.items():
        assert torch.equal(_gather(pieces[name], rank_groups, t.numel()), t)


def test_pickles_are_loaded_without_running_their_globals(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("this must not run",))

    torch.save({"x": Evil()}, tmp_path / "evil.pt")
    with pytest.raises(CheckpointError, match=r"evil\.pt references print, which zbench refuses"):
        load_pickle(tmp_path / "evil.pt")


def _fake_deepspeed(monkeypatch, module: str, cls: type) -> None:
    """Make `cls` importable as `module.<name>` (so pickle can save it) without DeepSpeed."""
    parts = module.split(".")
    for i in range(1, len(parts) + 1):
        monkeypatch.setitem(sys.modules, ".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    cls.__module__, cls.__qualname__ = module, cls.__name__
    setattr(sys.modules[module], cls.__name__, cls)


def test_fp16_style_checkpoint_with_a_dynamic_loss_scaler(tmp_path, monkeypatch):
    """fp16 runs differ by a fp16 module copy and a DynamicLossScaler in the optimizer files.

    DeepSpeed refuses fp16 on CPU, so this one is derived from the ZeRO-2 fp32 fixture."""

    class DynamicLossScaler:
        def __init__(self):
            self.cur_scale, self.dynamic, self.dtype = 65536.0, True, torch.float16

    _fake_deepspeed(monkeypatch, "deepspeed.runtime.fp16.loss_scaler", DynamicLossScaler)
    src_dir = next(p for p in DEEPSPEED if p.name == "2_2_fp32")
    folder = tmp_path / "global_step2"
    shutil.copytree(src_dir / "global_step2", folder)
    model = load_pickle(folder / "mp_rank_00_model_states.pt", mmap=False)
    model["module"] = {k: v.half() for k, v in model["module"].items()}
    model["frozen_param_fragments"] = {k: v.half() for k, v in model["frozen_param_fragments"].items()}
    model["ds_config"] = {**model["ds_config"], "fp16": {"enabled": True}}
    torch.save(model, folder / "mp_rank_00_model_states.pt")
    for f in folder.glob("*_optim_states.pt"):
        sd = load_pickle(f, mmap=False)
        sd["optimizer_state_dict"]["loss_scaler"] = DynamicLossScaler()
        sd["optimizer_state_dict"]["zero_stage"] = int(sd["optimizer_state_dict"]["zero_stage"])
        del sd["optimizer_state_dict"]["param_slice_mappings"]  # older DeepSpeed: the offset arithmetic is used
        torch.save(sd, f)
    monkeypatch.undo()  # reading must not need the fake modules
    src = open_source(folder)
    assert src.precision == "fp16"
    scaler = load_pickle(folder / "zero_pp_rank_0_mp_rank_00_optim_states.pt")["optimizer_state_dict"]["loss_scaler"]
    assert scaler.cur_scale == 65536.0 and scaler.dtype == torch.float16
    expected, _ = _expected(src_dir)
    for name in ("emb.weight", "lin2.bias"):
        assert torch.equal(src.load(name), expected[name])
    assert torch.equal(src.load("norm.weight"), expected["norm.weight"].half().float())
