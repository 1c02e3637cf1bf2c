"""zbench checkpoints tried as an attacker and as an unlucky user would: nothing read from a manifest is
evaluated, crafted but checksum-consistent files are refused, a tag replaced during a crash stays
loadable, and a checkpoint pruned while it is read is one clear line."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import zero_core
from checkpoints import manifest as mf
from checkpoints import zbench_format as fmt
from checkpoints.source import CheckpointError
from checkpoints.zbench_source import ZbenchSource
from ckpt_workers import _train, config
from dist_harness import run_ranks
from helpers import REPO, cli, one_line_error
from parity_workers import make_model


@pytest.fixture
def ckpt(tmp_path) -> Path:
    engine = zero_core.initialize(make_model(), config(2, 1))
    _train(engine, 0, 1, range(1))
    engine.save_checkpoint(tmp_path / "ck")
    return tmp_path / "ck"


def _rewrite(folder: Path, change) -> None:
    """Edit the manifest and re-seal it with a matching checksum, as a crafted checkpoint would be."""
    m = json.loads((folder / mf.MANIFEST).read_text())
    change(m)
    data = json.dumps(m).encode()
    (folder / mf.MANIFEST).write_bytes(data)
    (folder / mf.CHECKSUM).write_text(f"{hashlib.sha256(data).hexdigest()}  {mf.MANIFEST}\n")


def _reseal_file(folder: Path, name: str) -> None:
    _rewrite(folder, lambda m: m["files"][name].update(mf.file_record(folder / name)))


# -- nothing read is evaluated ------------------------------------------------------------------------
def test_rng_states_are_plain_data_and_restored(ckpt):
    m = mf.read(ckpt / "global_step1")
    py = m["rng"]["0"]["python"]
    assert isinstance(py["internal"], list) and len(py["internal"]) == 625 and isinstance(m["rng"]["0"]["torch"], str)
    random.seed(99)
    torch.manual_seed(99)
    engine = zero_core.initialize(make_model(), config(2, 1))
    engine.load_checkpoint(ckpt)
    assert list(random.getstate()[1]) == py["internal"]


def _as_format_1(folder: Path, python_state: str) -> None:
    m = json.loads((folder / mf.MANIFEST).read_text())
    m["version"] = 1
    m["rng"]["0"]["python"] = python_state
    (folder / mf.MANIFEST).write_text(json.dumps(m))
    (folder / mf.CHECKSUM).unlink()


def test_format_1_checkpoints_still_load_their_rng(ckpt):
    tag = ckpt / "global_step1"
    internal = mf.read(tag)["rng"]["0"]["python"]["internal"]
    _as_format_1(tag, repr((3, tuple(internal), None)))
    engine = zero_core.initialize(make_model(), config(2, 1))
    assert engine.load_checkpoint(ckpt)[1] == {}
    assert list(random.getstate()[1]) == internal


@pytest.mark.parametrize("payload", ["__import__('os').system('touch {marker}')",
                                     "(3, (0,)*625, __import__('os').system('touch {marker}'))",
                                     "[c for c in ().__class__.__base__.__subclasses__()]"])
def test_code_in_a_format_1_rng_state_is_refused_and_never_run(ckpt, tmp_path, payload):
    marker = tmp_path / "pwned"
    _as_format_1(ckpt / "global_step1", payload.format(marker=marker))
    engine = zero_core.initialize(make_model(), config(2, 1))
    before = engine.full_state_dict()
    with pytest.raises(CheckpointError, match="RNG state is malformed"):
        engine.load_checkpoint(ckpt)
    assert not marker.exists()
    after = engine.full_state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before) and engine.global_step == 0


def test_no_eval_exec_or_unrestricted_unpickling_in_the_tree():
    offenders = []
    for package in ("zero_core", "checkpoints", "zbench"):
        for path in (REPO / package).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            for bad in ("eval(", "exec(", "pickle.load(", "pickle.loads(", "yaml.load(", "weights_only=False",
                        "yaml.unsafe_load", "yaml.full_load"):
                if bad in text.replace(".eval()", "").replace("def eval(", ""):
                    offenders.append(f"{path.relative_to(REPO)}: {bad}")
    assert offenders == []


# -- crafted, checksum-consistent files ---------------------------------------------------------------
def test_a_rank_file_with_other_tensors_is_refused(ckpt):
    tag = ckpt / "global_step1"
    n = mf.read(tag)["layout"]["partition_numel"]
    save_file({"master": torch.zeros(n + 7), "exp_avg": torch.zeros(n), "exp_avg_sq": torch.zeros(n)},
              str(tag / "rank_00000.safetensors"))
    _reseal_file(tag, "rank_00000.safetensors")
    engine = zero_core.initialize(make_model(), config(2, 1))
    with pytest.raises(CheckpointError, match="holds other tensors than its manifest lists"):
        engine.load_checkpoint(ckpt)
    res = cli("inspect", ckpt)
    assert "holds other tensors" in one_line_error(res), res.output
    assert "integrity" in res.output and "ok" not in res.output.split("integrity")[1].splitlines()[0]


@pytest.mark.parametrize("shape,expected", [([10**12, 10**12], "manifest.json is damaged (bad params entry"),
                                            ([10**6, 10**6], "frozen.safetensors holds other tensors")])
def test_a_frozen_entry_of_huge_shape_is_not_integrity_ok(ckpt, shape, expected):
    tag = ckpt / "global_step1"

    def grow(m):
        frozen = next(p for p in m["params"] if not p["trainable"] and not p["tied_to"])
        frozen["shape"] = shape
    _rewrite(tag, grow)
    assert expected in one_line_error(cli("inspect", ckpt))
    one_line_error(cli("convert", ckpt, "--to", "fp32", "--out", ckpt.parent / "out"))
    assert not (ckpt.parent / "out").exists()


def test_a_header_that_lies_about_its_size_is_one_line(ckpt):
    tag = ckpt / "global_step1"
    victim = tag / "frozen.safetensors"
    data = bytearray(victim.read_bytes())
    data[:8] = (2**63).to_bytes(8, "little")
    victim.write_bytes(bytes(data))
    _reseal_file(tag, "frozen.safetensors")
    assert "not a readable safetensors file" in one_line_error(cli("inspect", ckpt))


# -- replacing a tag, and readers racing a prune --------------------------------------------------------
def crash_while_replacing_best(rank: int, world: int, root: str) -> None:
    """Save tag 'best', train, then die between moving the old 'best' aside and renaming the new one in."""
    engine = zero_core.initialize(make_model(), config(2, 1))
    _train(engine, 0, 1, range(1))
    engine.save_checkpoint(root, tag="best")
    torch.save(engine.full_state_dict(), os.path.join(root, "expected.pt"))
    _train(engine, 0, 1, range(1, 2))
    real = os.replace

    def dying_replace(src, dst):
        real(src, dst)
        if ".best.old-" in str(dst):
            os._exit(3)

    fmt.os.replace = dying_replace
    fmt.dir_exchange.renameat2_exchange = None  # the two-rename path (no exchange on this system): its window
    engine.save_checkpoint(root, tag="best")


def test_a_crash_while_replacing_a_tag_leaves_a_loadable_checkpoint(tmp_path):
    import torch.multiprocessing as mp

    with pytest.raises(mp.ProcessExitedException):
        run_ranks(crash_while_replacing_best, 1, str(tmp_path))
    assert not (tmp_path / "best").exists() and len(list(tmp_path.glob(".best.old-*"))) == 1
    expected = torch.load(tmp_path / "expected.pt")
    engine = zero_core.initialize(make_model(), config(2, 1))
    engine.load_checkpoint(tmp_path)  # `latest` names best: its complete old copy is read
    assert all(torch.equal(engine.full_state_dict()[k], v) for k, v in expected.items())
    res = cli("inspect", tmp_path)
    assert res.exit_code == 0 and ".best.old-" in res.output, res.output
    assert not [line for line in res.output.splitlines() if line.startswith("Error:")], res.output
    engine.save_checkpoint(tmp_path, tag="other")  # the next save puts the old copy back first
    assert (tmp_path / "best").is_dir() and not list(tmp_path.glob(".best.old-*"))


def test_a_checkpoint_removed_while_read_is_one_line(ckpt):
    src = ZbenchSource(ckpt)
    shutil.rmtree(ckpt / "global_step1")
    problems = src.verify()
    assert problems and all("disappeared while it was read" in p or "is missing" in p for p in problems)
    with pytest.raises(CheckpointError, match="missing|disappeared"):
        src.load(src.params()[0].name)


@pytest.mark.parametrize("tag,expected", [("x" * 300, "longer than 255 bytes"), ("../escape", "not a plain name"),
                                          (".hidden", "not a plain name")])
def test_bad_tags_are_refused_before_writing(tmp_path, tag, expected):
    engine = zero_core.initialize(make_model(), config(2, 1))
    with pytest.raises(CheckpointError, match=expected):
        engine.save_checkpoint(tmp_path / "ck", tag=tag)
    assert not (tmp_path / "ck").exists() and not (tmp_path / "escape").exists()
    with pytest.raises(CheckpointError, match=expected):
        engine.load_checkpoint(tmp_path, tag=tag)


def test_a_symlinked_manifest_is_refused(ckpt, tmp_path):
    tag = ckpt / "global_step1"
    real = tmp_path / "elsewhere.json"
    shutil.move(tag / mf.MANIFEST, real)
    os.symlink(real, tag / mf.MANIFEST)
    with pytest.raises(CheckpointError, match="symbolic link"):
        ZbenchSource(ckpt)
    assert ZbenchSource(ckpt, follow_symlinks=True).summary().step == 1
