"""Manifest fields rewritten by hand (the manifest's checksum made to match): a training dtype zbench has no such
thing as, an entry's dtype no file can hold, more group lrs than the record has groups, a client optimizer's name
that would break the error line quoting it, settings of the wrong type. Each is refused when the checkpoint is
opened, in one line naming the key; a consistent record of another number of optimizer groups is refused by a load
of the optimizer's states (as DeepSpeed's load refuses it) before anything changes, and the weights alone load."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import torch
from ckpt_workers import config
from fault_workers import tiny_checkpoint
from helpers import read_command, refused
from parity_workers import make_model

from checkpoints import manifest as mf
from checkpoints.source import CheckpointError


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "ckpt")


def _edited(ckpt, tmp_path, edit):
    """A copy of `ckpt` whose manifest went through `edit`, its checksum file rewritten to match."""
    copy = tmp_path / "copy"
    shutil.copytree(ckpt, copy)
    tag = next(p for p in copy.iterdir() if p.is_dir())
    manifest = json.loads((tag / mf.MANIFEST).read_text())
    edit(manifest)
    raw = json.dumps(manifest, indent=1).encode()
    (tag / mf.MANIFEST).write_bytes(raw)
    (tag / mf.CHECKSUM).write_text(f"{hashlib.sha256(raw).hexdigest()}  {mf.MANIFEST}\n")
    return copy


def _set(path: tuple, value):
    def edit(m):
        node = m
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return edit


def _frozen_entry(m):
    return next(p for p in m["params"] if not p["trainable"])


CASES = {
    "dtype float128": (_set(("dtype",), "float128"), "'dtype' is 'float128', not one of float32, bfloat16, float16"),
    "dtype a list": (_set(("dtype",), ["float32"]), "'dtype' is ['float32'], not one of float32, bfloat16, float16"),
    "no dtype": (lambda m: m.pop("dtype"), "'dtype' is None, not one of float32, bfloat16, float16"),
    "entry dtype": (lambda m: _frozen_entry(m).update(dtype="float128"),
                    "dtype 'float128' is not one of float64, float32, float16, bfloat16"),
    "extra group lrs": (lambda m: m["optimizer"].update(group_lrs=m["optimizer"]["group_lrs"] * 3),
                        "optimizer.group_lrs has 3 entries but optimizer.group_values 1"),
    "client name": (_set(("optimizer", "client"), "SGD\nError: forged"), "optimizer.client is not an optimizer's"),
    "type": (_set(("optimizer", "type"), 7), "optimizer.type is not an optimizer's name"),
    "decoupled": (_set(("optimizer", "decoupled"), "yes"), "optimizer.decoupled is not true or false"),
    "clipping": (_set(("optimizer", "gradient_clipping"), -1.0), "optimizer.gradient_clipping is not a finite"),
}


@pytest.mark.parametrize("command", ["inspect", "convert"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_crafted_field_is_refused_when_the_checkpoint_is_opened(ckpt, tmp_path, case, command):
    edit, words = CASES[case]
    copy = _edited(ckpt, tmp_path, edit)
    line = refused(tmp_path, *read_command(command, copy, tmp_path / "out"))
    assert f"{mf.MANIFEST} is damaged (" in line and words in line, line


@pytest.mark.parametrize("case", ["dtype float128", "entry dtype", "extra group lrs"])
def test_load_checkpoint_refuses_them_too(ckpt, tmp_path, case):
    import zero_core

    edit, words = CASES[case]
    copy = _edited(ckpt, tmp_path, edit)
    engine = zero_core.initialize(make_model(), config(2, 1))
    with pytest.raises(CheckpointError, match="is damaged") as e:
        engine.load_checkpoint(copy)
    assert words in str(e.value) and "\n" not in str(e.value)


def _three_groups(m):
    """A record as a run with three optimizer groups saves it: consistent, so the checkpoint itself is sound."""
    o = m["optimizer"]
    o["group_lrs"], o["group_values"] = o["group_lrs"] * 3, o["group_values"] * 3


def test_another_number_of_groups_is_refused_by_a_load_of_the_optimizer_before_any_change(ckpt, tmp_path):
    import zero_core

    copy = _edited(ckpt, tmp_path, _three_groups)
    engine = zero_core.initialize(make_model(), config(2, 1))
    before, lrs = engine.full_state_dict(), engine.get_lr()
    with pytest.raises(CheckpointError) as e:
        engine.load_checkpoint(copy)
    assert "holds the optimizer states of 3 parameter group(s), but this optimizer has 1" in str(e.value), e.value
    assert "load_optimizer_states=False" in str(e.value)
    after = engine.full_state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before) and engine.get_lr() == lrs
    engine.load_checkpoint(copy, load_optimizer_states=False)  # the weights alone: no group is written
    saved = zero_core.initialize(make_model(), config(2, 1))
    saved.load_checkpoint(ckpt)
    want, got = saved.full_state_dict(), engine.full_state_dict()
    assert all(torch.equal(want[k], got[k]) for k in want)


@pytest.mark.parametrize("command", ["inspect", "convert"])
def test_more_than_the_checksum_line_in_manifest_sha256_is_refused(ckpt, tmp_path, command):
    copy = _edited(ckpt, tmp_path, lambda m: None)
    checksum = next(copy.glob(f"*/{mf.CHECKSUM}"))
    with open(checksum, "a") as f:
        f.write("EVIL  rank_00000.safetensors\n")
    line = refused(tmp_path, *read_command(command, copy, tmp_path / "out"))
    assert f"{checksum} holds more than the sha256sum line of {mf.MANIFEST}" in line, line
