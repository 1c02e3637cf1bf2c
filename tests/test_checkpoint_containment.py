"""Checkpoint readers read only inside the checkpoint: crafted chunk paths, links, pointer files, odd metadata.

Each refusal is one `Error:` line naming the problem and the fix, with nothing written and the input unchanged.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from checkpoint_helpers import DCP, DEEPSPEED, UNIVERSAL
from helpers import cli, read_command, refused

DS = next(p for p in DEEPSPEED if p.name == "2_2_fp32")
MARKER = torch.full((4, 3), 1234.5678)  # bytes that must never reach an output


def converts_to(folder: Path, out: Path, expected: Path, *extra) -> None:
    result = cli("convert", folder, "--to", "fp32", "--out", out, *extra)
    assert result.exit_code == 0, result.output
    got, want = load_file(out / "model.safetensors"), load_file(expected)
    for name in got:
        assert torch.equal(got[name], want[name].float()), name


# -- DCP: chunk files named by a crafted .metadata ------------------------------------------------------


def save_dcp(folder: Path, tensors: dict[str, torch.Tensor]) -> None:
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no process group": one process saves everything
        dcp.save(tensors, checkpoint_id=str(folder))


def rewrite_storage(folder: Path, **fields) -> None:
    """Rewrite every storage entry of `.metadata` with `fields` (the test's own, trusted pickle)."""
    with open(folder / ".metadata", "rb") as f:
        md = pickle.load(f)
    md.storage_data = {k: dataclasses.replace(v, **fields) for k, v in md.storage_data.items()}
    (folder / ".metadata").write_bytes(pickle.dumps(md))


@pytest.mark.parametrize("where", ["absolute", "parent"])
@pytest.mark.parametrize("command", ["convert", "inspect"])
def test_a_chunk_path_outside_the_folder_is_refused_before_any_read(tmp_path, where, command):
    folder = tmp_path / "ck"
    save_dcp(folder, {"w": MARKER.clone(), "b": torch.ones(3)})
    assert sorted(p.name for p in folder.glob("*.distcp")) == ["__0_0.distcp"]
    outside = tmp_path / "elsewhere" / "secret.distcp" if where == "absolute" else tmp_path / "outside.distcp"
    outside.parent.mkdir(exist_ok=True)
    os.replace(folder / "__0_0.distcp", outside)  # the real chunk bytes, now outside the folder
    rel = str(outside) if where == "absolute" else "../outside.distcp"
    rewrite_storage(folder, relative_path=rel)
    line = refused(tmp_path, *read_command(command, folder, tmp_path / "out"))
    assert rel in line and str(folder) in line and "chunk file" in line, line
    assert ("is an absolute path" if where == "absolute" else "points outside") in line, line
    assert not (tmp_path / "out").exists()
    secret = MARKER.numpy().tobytes()
    leaked = [p for p in tmp_path.rglob("*") if p.is_file() and p != outside and secret in p.read_bytes()]
    assert leaked == []


@pytest.mark.parametrize(
    "change,expected",
    [
        (
            lambda md: setattr(md, "storage_data", list(md.storage_data.values())),
            "no state_dict_metadata and storage_data",
        ),
        (
            lambda md: [setattr(v, "relative_path", 7) for v in md.storage_data.values()],
            "has no file name, offset or length",
        ),
        (lambda md: [setattr(v, "offset", -8) for v in md.storage_data.values()], "has no file name, offset or length"),
        (
            lambda md: setattr(md.state_dict_metadata["w"].properties, "dtype", "float32"),
            "'w' has no dtype, size or chunk",
        ),
        (lambda md: setattr(md.state_dict_metadata["w"], "size", ("4", 3)), "'w' has no dtype, size or chunk"),
        (lambda md: setattr(md, "planner_data", {"w": 5}), "planner_data is not a mapping"),
        (lambda md: md.state_dict_metadata.update({"x": 3}), "entry 'x' is not a tensor or bytes entry"),
    ],
    ids=["storage list", "path int", "offset negative", "dtype str", "size str", "planner", "entry int"],
)
def test_metadata_of_allowed_classes_with_wrong_field_types(tmp_path, change, expected):
    folder = tmp_path / "ck"
    save_dcp(folder, {"w": MARKER.clone()})
    with open(folder / ".metadata", "rb") as f:
        md = pickle.load(f)
    change(md)
    (folder / ".metadata").write_bytes(pickle.dumps(md))
    for args in (["inspect", folder], ["convert", folder, "--to", "fp32", "--out", tmp_path / "out"]):
        line = refused(tmp_path, *args)
        assert "is not valid torch.distributed.checkpoint metadata" in line and expected in line, line


@pytest.mark.parametrize("verify", [True, False])
def test_a_chunk_reaching_past_its_file(tmp_path, verify):
    folder = tmp_path / "ck"
    save_dcp(folder, {"w": MARKER.clone()})
    rewrite_storage(folder, offset=10**6)
    line = refused(
        tmp_path, "convert", folder, "--to", "fp32", "--out", tmp_path / "out", *([] if verify else ["--no-verify"])
    )
    assert "__0_0.distcp is truncated" in line and "needs 10" in line, line


def test_metadata_naming_other_dcp_classes_is_refused(tmp_path):
    """The metadata modules also hold DCP's writers and loaders: only its metadata classes may be built."""
    folder = tmp_path / "ck"
    save_dcp(folder, {"w": MARKER.clone()})
    (folder / ".metadata").write_bytes(
        b"ctorch.distributed.checkpoint.filesystem\nFileSystemWriter\n(X\x03\x00\x00\x00newtR."
    )
    line = refused(tmp_path, "inspect", folder)
    assert "FileSystemWriter is not a DCP metadata class" in line, line


# -- links inside SRC: refused unless --follow-symlinks, and then read like the file itself --------------


def _link_away(path: Path, away: Path) -> None:
    """Move `path` to `away` and leave a relative symbolic link to it in its place."""
    away.parent.mkdir(parents=True, exist_ok=True)
    os.replace(path, away)
    os.symlink(os.path.relpath(away, path.parent), path)


LINKS = [  # (fixture, path of the link inside the copy, what the error calls it, the reference output)
    (DS, "global_step2/zero_pp_rank_1_mp_rank_00_optim_states.pt", "rank file", DS / "expected_fp32.safetensors"),
    (DS, "global_step2/mp_rank_00_model_states.pt", "model-states file", DS / "expected_fp32.safetensors"),
    (DS, "latest", "tag pointer", DS / "expected_fp32.safetensors"),
    (DS, "global_step2", "tag folder", DS / "expected_fp32.safetensors"),
    (
        UNIVERSAL[0],
        "global_step2_universal/zero/emb.weight/fp32.pt",
        "parameter file",
        DEEPSPEED[0].parent / UNIVERSAL[0].name / "expected_fp32.safetensors",
    ),
    (
        UNIVERSAL[0],
        "global_step2_universal/zero/lin2.bias",
        "parameter file",
        DEEPSPEED[0].parent / UNIVERSAL[0].name / "expected_fp32.safetensors",
    ),
    (DCP[0], ".metadata", "DCP metadata", DCP[0] / "expected_full.safetensors"),
    (DCP[0], "__1_0.distcp", "chunk file", DCP[0] / "expected_full.safetensors"),
]


@pytest.mark.parametrize("fixture,rel,what,expected", LINKS, ids=[f"{f.parent.name}:{r}" for f, r, _, _ in LINKS])
def test_a_link_inside_the_checkpoint_is_refused_unless_followed(tmp_path, fixture, rel, what, expected):
    folder = tmp_path / "ck"
    shutil.copytree(fixture, folder)
    _link_away(folder / rel, tmp_path / "elsewhere" / Path(rel).name)
    for args in (["convert", folder, "--to", "fp32", "--out", tmp_path / "out"], ["inspect", folder]):
        line = refused(tmp_path, *args)
        assert f"{what} {folder / rel} is a symbolic link" in line and "--follow-symlinks" in line, line
    assert not (tmp_path / "out").exists()
    converts_to(folder, tmp_path / "out", expected, "--follow-symlinks")
    assert cli("inspect", folder, "--follow-symlinks").exit_code == 0


def test_src_itself_may_be_a_link(tmp_path):
    os.symlink(DS, tmp_path / "ck")
    converts_to(tmp_path / "ck", tmp_path / "out", DS / "expected_fp32.safetensors")


@pytest.mark.parametrize("rel", ["manifest.json", "rank_00000.safetensors"])
def test_a_link_inside_a_zbench_checkpoint_is_refused(tmp_path, rel):
    from fault_workers import tiny_checkpoint

    root = tiny_checkpoint(tmp_path / "ck")
    tag = (root / "latest").read_text().strip()
    _link_away(root / tag / rel, tmp_path / "elsewhere" / rel)
    line = refused(tmp_path, "convert", root, "--to", "fp32", "--out", tmp_path / "out")
    assert "symbolic link" in line and "--follow-symlinks" in line, line


# -- the tag a pointer file names, and --tag ---------------------------------------------------------------

POINTERS = [
    (b"../other/global_step2", "is not a plain name"),
    (None, "is not a plain name"),  # an absolute path to a real checkpoint
    (b"g" * 5000, "is larger than 4096 bytes"),
    (b"g" * 300, "is longer than 255 bytes"),
    (b"", "is not a name"),
    (b"  \n", "is not a name"),
    (b"\xff\xfeglobal_step2", "is not UTF-8 text"),
    (b"x" * 10**6, "is larger than 4096 bytes"),
]


@pytest.mark.parametrize(
    "content,expected", POINTERS, ids=["parent", "absolute", "5000", "300", "empty", "blank", "bytes", "huge"]
)
def test_a_pointer_file_must_name_a_tag_folder_inside(tmp_path, content, expected):
    shutil.copytree(DS, tmp_path / "other")  # a real checkpoint the pointer may try to reach
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / "latest").write_bytes(
        content if content is not None else str(tmp_path / "other" / "global_step2").encode()
    )
    for args in (["convert", folder, "--to", "fp32", "--out", tmp_path / "out"], ["inspect", folder]):
        line = refused(tmp_path, *args)
        assert expected in line and f"{folder / 'latest'}" in line and "pass --tag" in line, line


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_a_pointer_that_is_not_a_file(tmp_path, kind):
    folder = tmp_path / "ck"
    shutil.copytree(DS, folder)
    (folder / "latest").unlink()
    (folder / "latest").mkdir() if kind == "folder" else os.mkfifo(folder / "latest")  # a FIFO must not hang us
    line = refused(tmp_path, "inspect", folder)  # the snapshot records the FIFO without reading it
    assert ("is a folder" if kind == "folder" else "is not a regular file") in line and "pass --tag" in line, line


@pytest.mark.parametrize(
    "tag,expected",
    [
        ("t" * 5000, "is longer than 255 bytes"),
        ("../ck2/global_step2", "not a plain name"),
        ("t" * 10000, "is longer than 255 bytes"),
    ],
    ids=["5000", "parent", "10000"],
)
def test_a_tag_must_be_a_plain_name(tmp_path, tag, expected):
    folder = tmp_path / "ck"
    shutil.copytree(DS, folder)
    shutil.copytree(DS, tmp_path / "ck2")
    for args in (
        ["convert", folder, "--to", "fp32", "--out", tmp_path / "out", "--tag", tag],
        ["inspect", folder, "--tag", tag],
    ):
        line = refused(tmp_path, *args)
        assert f"tag (--tag) '{tag[:20]}" in line and expected in line and "pass --tag" in line and len(line) < 400, (
            line
        )


def test_a_src_path_too_long_for_the_system(tmp_path):
    line = refused(tmp_path, "inspect", tmp_path / ("s" * 10000))
    assert "File name too long" in line and "check the path" in line and len(line) < 400, line
