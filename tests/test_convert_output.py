"""The converter's output never loses data: one claim per --out, no deletion of what is not ours, never inside SRC.

Real processes race and are killed here (`python -m zbench.cli convert`), on a DCP source of a few thousand
small tensors: reading each on its own keeps a convert busy for seconds while writing only a few MB.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from checkpoint_helpers import DCP, DEEPSPEED
from helpers import REPO, cli, one_line_error, refused, snapshot
from checkpoints.consolidate import write_consolidated
from checkpoints.output_claim import OWNER_FILE, claimed_output, staging_dir
from checkpoints.source import CheckpointError

pytestmark = pytest.mark.slow  # spawned ranks or whole runs: outside the fast tier (-m 'not slow')

DS = next(p for p in DEEPSPEED if p.name == "2_2_fp32")


@pytest.fixture(scope="module")
def slow_src(tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor]]:
    import torch.distributed.checkpoint as dcp

    gen = torch.Generator().manual_seed(0)
    tensors = {f"layer{i}.weight": torch.randn(64, generator=gen) for i in range(600)}
    folder = tmp_path_factory.mktemp("slow") / "ck"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(tensors, checkpoint_id=str(folder))
    return folder, tensors


def start_convert(src: Path, out: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, "-m", "zbench.cli", "convert", str(src), "--to", "fp32", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )


def assert_output(out: Path, tensors: dict[str, torch.Tensor]) -> None:
    got = load_file(out / "model.safetensors")
    assert set(got) == set(tensors) and all(torch.equal(got[k], t) for k, t in tensors.items())
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors"]


def test_two_converts_into_one_new_out_one_wins_and_its_output_survives(slow_src, tmp_path):
    src, tensors = slow_src
    out = tmp_path / "new" / "deeper" / "out"  # parents made by whichever claims first
    procs = [start_convert(src, out) for _ in range(2)]
    results = [(p, *p.communicate(timeout=300)) for p in procs]
    winners = [p for p, _, _ in results if p.returncode == 0]
    assert len(winners) == 1, [(p.returncode, err[-2000:]) for p, _, err in results]
    assert_output(out, tensors)
    ((loser, _, err),) = [r for r in results if r[0] is not winners[0]]
    line = one_line_error(subprocess.CompletedProcess(loser.args, loser.returncode, None, err))
    # the loser meets the winner's claim, or (started late on a busy machine) its finished output
    assert line in (
        f"Error: another zbench convert (pid {winners[0].pid}) is writing {out}; wait for it or pass another --out",
        f"Error: output folder {out} already holds files; pass an empty or new --out",
    ), line
    assert sorted(p.name for p in out.parent.iterdir()) == ["out"]  # no staging folder left


def test_a_killed_convert_is_named_on_the_rerun_and_never_deleted_for_you(slow_src, tmp_path):
    src, tensors = slow_src
    out = tmp_path / "new" / "out"
    staging = staging_dir(out)
    proc = start_convert(src, out)
    while proc.poll() is None and not (staging / OWNER_FILE).exists():
        time.sleep(0.005)
    assert proc.poll() is None, "the convert finished before it could be killed: make slow_src larger"
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert staging.is_dir() and not out.exists()
    line = refused(tmp_path, "convert", src, "--to", "fp32", "--out", out)
    assert line == (
        f"Error: {staging} is left by a zbench convert that was killed (pid {proc.pid} no longer runs); "
        "delete it and run again"
    ), line
    shutil.rmtree(staging)  # what the message asks the user to do
    result = cli("convert", src, "--to", "fp32", "--out", out)
    assert result.exit_code == 0, result.output
    assert_output(out, tensors)


def test_a_second_claim_is_refused_and_deletes_nothing(tmp_path):
    """Deterministic: the second convert arrives while the first holds the claim (same process, so its pid runs)."""
    out = tmp_path / "new" / "deeper" / "out"
    small = DCP[0]
    from checkpoints.detect import open_source

    with claimed_output(out) as staging:
        (staging / "model.safetensors").write_bytes(b"the first convert's output")
        before = snapshot(tmp_path)
        with pytest.raises(CheckpointError) as e:
            write_consolidated(open_source(small), out, torch.float32, 10**9, progress=False)
        assert (
            str(e.value)
            == f"another zbench convert (pid {os.getpid()}) is writing {out}; wait for it or pass another --out"
        )
        line = one_line_error(cli("convert", small, "--to", "fp32", "--out", out))
        assert "another zbench convert" in line and snapshot(tmp_path) == before
    assert (out / "model.safetensors").read_bytes() == b"the first convert's output"
    assert not staging.exists()


def test_the_claim_itself_is_exclusive(tmp_path, monkeypatch):
    """Both converts passed the up-front check before either claimed: the claim alone must decide."""
    from checkpoints import output_claim

    out = tmp_path / "out"
    with claimed_output(out) as staging:
        (staging / "model.safetensors").write_bytes(b"the first convert's output")
        monkeypatch.setattr(output_claim, "check_output", lambda *args: None)
        with pytest.raises(CheckpointError, match=re.escape(f"another zbench convert (pid {os.getpid()}) is writing")):
            with claimed_output(out) as second:
                (second / "model.safetensors").write_bytes(b"the second convert's output")
        assert sorted(p.name for p in staging.iterdir()) == sorted([OWNER_FILE, "model.safetensors"])
    assert (out / "model.safetensors").read_bytes() == b"the first convert's output"


def test_a_claim_from_another_host_or_with_no_owner_is_explained(tmp_path):
    out = tmp_path / "out"
    staging = staging_dir(out)
    staging.mkdir()
    (staging / OWNER_FILE).write_text(json.dumps({"pid": 4242, "host": socket.gethostname() + "-other"}))
    line = refused(tmp_path, "convert", DS, "--to", "fp32", "--out", out)
    assert f"another zbench convert (pid 4242 on {socket.gethostname()}-other) is writing {out}" in line, line
    assert f"if it no longer runs, delete {staging} and run again" in line, line
    (staging / OWNER_FILE).unlink()
    line = refused(tmp_path, "convert", DS, "--to", "fp32", "--out", out)
    assert f"{staging} is in the way of --out {out} and names no zbench convert" in line and "delete it" in line, line


@pytest.mark.parametrize(
    "where", ["src", "tag folder", "inside tag", "inside src", "through a link", "followed tag link"]
)
def test_out_inside_the_source_is_refused(tmp_path, where):
    src = tmp_path / "ck"
    shutil.copytree(DS, src)
    os.symlink(src, tmp_path / "link")
    extra = []
    if where == "followed tag link":  # the tag folder lives elsewhere; the user vouches for the link
        shutil.move(src / "global_step2", tmp_path / "tags" / "global_step2")
        os.symlink(tmp_path / "tags" / "global_step2", src / "global_step2")
        extra = ["--follow-symlinks"]
    out = {
        "src": src,
        "tag folder": src / "global_step2",
        "inside tag": src / "global_step2" / "out",
        "inside src": src / "new" / "out",
        "through a link": tmp_path / "link" / "out",
        "followed tag link": tmp_path / "tags" / "global_step2" / "out",
    }[where]
    line = refused(tmp_path, "convert", src, "--to", "fp32", "--out", out, *extra)
    if where == "src":
        assert line == (
            f"Error: --out {out} is the checkpoint {src} itself: it already holds files, and writing there "
            "would change the source; pass an --out outside it"
        ), line
    else:
        checkpoint = src / "global_step2" if where == "followed tag link" else src
        assert line == (
            f"Error: --out {out} is inside the checkpoint {checkpoint}; writing there would change the "
            "source; pass an --out outside it"
        ), line


def test_reshard_claims_its_output_too(tmp_path):
    from fault_workers import tiny_checkpoint

    from checkpoints.reshard import reshard_to_zbench
    from checkpoints.zbench_source import ZbenchSource

    root = tiny_checkpoint(tmp_path / "ck")
    tag = (root / "latest").read_text().strip()
    before = snapshot(tmp_path)
    with pytest.raises(CheckpointError, match="is inside the checkpoint"):
        reshard_to_zbench(ZbenchSource(root), root / tag / "r2", 2)
    with pytest.raises(CheckpointError, match="is inside the checkpoint"):
        reshard_to_zbench(ZbenchSource(root), root / "r2", 2, protect=[root])
    out = tmp_path / "new" / "r2"
    with claimed_output(out):
        with pytest.raises(
            CheckpointError, match=re.escape(f"another zbench convert (pid {os.getpid()}) is writing {out}")
        ):
            reshard_to_zbench(ZbenchSource(root), out, 2)
    assert list(out.iterdir()) == [] and snapshot(root) == before_root(before)  # the holder's (empty) output only
    written = reshard_to_zbench(ZbenchSource(root), tmp_path / "r2", 2)
    assert written == tmp_path / "r2" / tag
    assert sorted(p.name for p in (tmp_path / "r2").iterdir()) == sorted(["latest", tag])


def before_root(before: dict[str, str]) -> dict[str, str]:
    """The entries of a snapshot of tmp_path that lie under ck/, relative to ck."""
    return {k.removeprefix("ck" + os.sep): v for k, v in before.items() if k.startswith("ck" + os.sep)}


def test_a_failed_convert_keeps_what_others_put_in_the_parents_it_made(tmp_path):
    from test_consolidate import DictSource

    out = tmp_path / "new" / "deeper" / "out"

    class Interleaved(DictSource):
        """Another convert finishes into new/deeper while this one is still writing, then this one fails."""

        def load(self, name):
            if name == "b":
                (out.parent / "theirs").mkdir()
                (out.parent / "theirs" / "model.safetensors").write_bytes(b"their finished output")
            return super().load(name)

    src = Interleaved({"a": torch.ones(3), "b": torch.ones(4), "c": torch.ones(5)}, fail_at="c")
    with pytest.raises(CheckpointError, match="truncated"):
        write_consolidated(src, out, torch.float32, 10**9, progress=False)
    assert (out.parent / "theirs" / "model.safetensors").read_bytes() == b"their finished output"
    assert sorted(p.name for p in out.parent.iterdir()) == ["theirs"]


@pytest.mark.parametrize("out", ["new/deeper/out", "keep/out", "empty out"])
def test_a_failed_convert_removes_only_what_it_created(tmp_path, out):
    src = tmp_path / "ck"
    shutil.copytree(DCP[0], src)
    victim = src / "__1_0.distcp"
    victim.write_bytes(victim.read_bytes()[:200])  # fails mid-way, after the output was claimed
    (tmp_path / "keep").mkdir()
    (tmp_path / "empty out").mkdir()
    line = refused(tmp_path, "convert", src, "--to", "fp32", "--out", tmp_path / out, "--no-verify")
    assert "__1_0.distcp is truncated" in line, line
    assert (tmp_path / "keep").is_dir() and (tmp_path / "empty out").is_dir() and not (tmp_path / "new").exists()


def test_the_owner_record_is_whole_whenever_its_name_exists(tmp_path, monkeypatch):
    """A convert killed while writing its owner record leaves no owner file that names no one."""
    from checkpoints import output_claim

    def cut_short(record, f):
        f.write('{"pid": ')
        f.flush()
        raise KeyboardInterrupt  # stands for the kill in the middle of the write

    monkeypatch.setattr(output_claim.json, "dump", cut_short)
    with pytest.raises(KeyboardInterrupt):
        output_claim._write_owner(tmp_path)
    assert not (tmp_path / OWNER_FILE).exists() and list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    output_claim._write_owner(tmp_path)
    assert json.loads((tmp_path / OWNER_FILE).read_text())["pid"] == os.getpid()
    assert [p.name for p in tmp_path.iterdir()] == [OWNER_FILE]


def test_an_empty_out_the_user_made_keeps_its_permission_bits(tmp_path):
    out = tmp_path / "group_share"
    out.mkdir()
    os.chmod(out, 0o2770)  # setgid, group-writable: what a shared project folder is given
    with claimed_output(out) as staging:
        (staging / "model.safetensors").write_bytes(b"x")
    assert (out / "model.safetensors").read_bytes() == b"x"
    assert os.stat(out).st_mode & 0o7777 == 0o2770


def test_an_out_that_is_a_mount_point_is_refused_before_any_work(tmp_path, monkeypatch):
    out = tmp_path / "mnt"
    out.mkdir()
    real_ismount = os.path.ismount
    monkeypatch.setattr(os.path, "ismount", lambda p: Path(p) == out or real_ismount(p))  # no mount without root
    with pytest.raises(CheckpointError, match=r"is a mount point: .*inside it, e\.g\. --out .*mnt/out"):
        with claimed_output(out):
            pytest.fail("claimed a mount point")
    assert list(tmp_path.iterdir()) == [out] and not any(out.iterdir())  # nothing staged beside it, nothing inside
