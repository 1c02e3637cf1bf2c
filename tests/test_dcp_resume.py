"""`engine.load_checkpoint` of torch.distributed.checkpoint (DCP) saves from FSDP2 on 2 ranks (tests/fixtures/dcp) and
of an Accelerate FSDP save (tests/fixtures/accelerate/checkpoint-2: the optimizer in `optimizer_0/` beside the model):
zero_core resumes each at any stage and number of ranks, Adam's moments and step included, and trains on as FSDP2
itself does from it (`dcp/model_optim/continued.safetensors`, recorded by tests/fixtures/make_dcp_fixtures.py
--continue-from: the same batches, split over FSDP2's 2 ranks)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from dist_harness import run_ranks
from safetensors import safe_open
from safetensors.torch import load_file
from test_deepspeed_resume import _engine, ds_fixtures

from checkpoints.source import CheckpointError
from helpers import FIXTURES

DCP = FIXTURES / "dcp"
CONTINUED = DCP / "model_optim" / "continued.safetensors"
SAVES = {"model_optim": DCP / "model_optim", "app_state": DCP / "app_state",
         "accelerate": FIXTURES / "accelerate" / "checkpoint-2"}


def _resume_and_train(rank: int, world: int, stage: int, offload: bool, folder) -> dict:
    engine = _engine(stage, offload, micro=4 // world, clipping=0.0)  # the FSDP2 run did not clip
    _, client = engine.load_checkpoint(folder)
    out = {"steps": engine.global_steps, "client": client, "losses": []}
    gen = torch.Generator().manual_seed(ds_fixtures.CONTINUE_SEED)
    for _ in range(ds_fixtures.CONTINUE_STEPS):
        batch = torch.randint(0, 11, (4, 5), generator=gen)
        loss = engine(batch[rank * 4 // world : (rank + 1) * 4 // world])
        engine.backward(loss)
        engine.step()
        mean = loss.detach().clone()
        if world > 1:
            torch.distributed.all_reduce(mean)
        out["losses"].append(float(mean) / world)
    out["state"] = engine.full_state_dict()
    engine.close()
    return out


def _fsdp2s() -> tuple[dict, list[float]]:
    with safe_open(str(CONTINUED), "pt") as f:
        losses = json.loads(f.metadata()["losses"])
    return load_file(str(CONTINUED)), losses


def _trains_on_as_fsdp2_does(got: dict) -> None:
    want, losses = _fsdp2s()
    assert got["steps"] == 2 and got["client"] == {}  # Adam's step count, as saved
    assert got["losses"] == pytest.approx(losses, rel=1e-6)
    for name, w in want.items():
        assert torch.allclose(got["state"][name], w, rtol=0, atol=1e-6), name


@pytest.mark.parametrize("save, stage", [("model_optim", 1), ("model_optim", 3), ("app_state", 2), ("accelerate", 3)])
def test_a_dcp_save_resumes_on_one_rank_and_trains_on_as_fsdp2_does(save, stage):
    _trains_on_as_fsdp2_does(_resume_and_train(0, 1, stage, False, SAVES[save]))


@pytest.mark.slow
@pytest.mark.parametrize("save, stage, offload", [("model_optim", 3, False), ("accelerate", 2, True)])
def test_a_dcp_save_resumes_on_two_ranks(save, stage, offload):
    got = run_ranks(_resume_and_train, 2, stage, offload, SAVES[save])
    _trains_on_as_fsdp2_does(got)


def test_a_save_without_optimizer_states_is_one_line_then_loads_its_weights_as_told():
    engine = _engine(2)
    before = engine.full_state_dict()
    with pytest.raises(CheckpointError) as e:
        engine.load_checkpoint(DCP / "plain")
    message = str(e.value)
    assert "holds no optimizer exp_avg of" in message and "load_optimizer_states=False" in message
    assert "\n" not in message and all(torch.equal(v, engine.full_state_dict()[k]) for k, v in before.items())
    engine.load_checkpoint(DCP / "plain", load_optimizer_states=False)
    want = load_file(str(DCP / "plain" / "expected_full.safetensors"))
    got = engine.full_state_dict()
    assert all(torch.equal(got[k], want[k]) for k in got)  # the weights, frozen and tied ones included
    engine.close()


def test_a_truncated_chunk_file_is_one_line_and_changes_nothing(tmp_path):
    copy = tmp_path / "model_optim"
    shutil.copytree(DCP / "model_optim", copy)
    chunk = copy / "__1_0.distcp"
    chunk.write_bytes(chunk.read_bytes()[:-100])  # DCP's raw tensor bytes carry no checksum: a cut file is caught
    engine = _engine(2)
    before = engine.full_state_dict()
    with pytest.raises(CheckpointError) as e:
        engine.load_checkpoint(copy)
    assert "__1_0.distcp is truncated" in str(e.value) and "nothing was loaded" in str(e.value)
    assert "\n" not in str(e.value) and all(torch.equal(v, engine.full_state_dict()[k]) for k, v in before.items())
    engine.close()


def test_an_optimizer_folder_linked_from_elsewhere_is_one_line_and_changes_nothing(tmp_path):
    save = tmp_path / "checkpoint-2"
    shutil.copytree(SAVES["accelerate"], save)
    elsewhere = tmp_path / "elsewhere"
    (save / "optimizer_0").rename(elsewhere)
    (save / "optimizer_0").symlink_to(elsewhere, target_is_directory=True)
    engine = _engine(2)
    before = engine.full_state_dict()
    with pytest.raises(CheckpointError) as e:
        engine.load_checkpoint(save)
    assert "optimizer folder" in str(e.value) and "\n" not in str(e.value)
    assert all(torch.equal(v, engine.full_state_dict()[k]) for k, v in before.items())
    engine.close()



class _Payload:  # a class no checkpoint reader allows: its instance in meta.pt must be refused, never built
    def __reduce__(self):
        return (print, ("unpickled",))


@pytest.mark.parametrize("meta, problem", [
    ({"epoch": 1, "global_step": 2, "loops": {"fit_loop": {}}}, None),
    ([1, 2], "holds list, not Lightning's checkpoint entries"),
    ({"hparams": _Payload()}, "which zbench refuses to load"),
    ("link", "symbolic link"),
])
def test_lightnings_meta_pt_comes_back_as_plain_data_or_one_line(tmp_path, capsys, meta, problem):
    """meta.pt beside the shards (Lightning's ModelParallelStrategy) is the client_state; anything but plain data,
    or a link out of the folder, is one line and nothing changes."""
    folder = tmp_path / "save"
    shutil.copytree(DCP / "model_optim", folder)
    if meta == "link":
        (tmp_path / "elsewhere.pt").write_bytes(b"")
        (folder / "meta.pt").symlink_to(tmp_path / "elsewhere.pt")
    else:
        torch.save(meta, folder / "meta.pt")
    engine = _engine(2)
    before = engine.full_state_dict()
    if problem is None:
        assert engine.load_checkpoint(folder)[1] == meta
        return
    with pytest.raises(CheckpointError) as e:
        engine.load_checkpoint(folder)
    assert problem in str(e.value) and "\n" not in str(e.value)
    assert "unpickled" not in capsys.readouterr().out
    assert all(torch.equal(v, engine.full_state_dict()[k]) for k, v in before.items())
