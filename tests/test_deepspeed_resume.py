"""`engine.load_checkpoint` of DeepSpeed 0.19.8 checkpoints: ZeRO-1/2/3 ones saved on 2 ranks (tests/fixtures/deepspeed)
and a universal one (tests/fixtures/deepspeed_universal/3_2_fp32, ZeRO-3 on 2 ranks through ds_to_universal.py).
zero_core resumes each at any stage and on any number of ranks, and trains on as DeepSpeed itself does from it
(`continued.safetensors` beside each, recorded by tests/fixtures/make_deepspeed_fixtures.py --continue-zero /
--continue-universal: the same batches, split over DeepSpeed's ranks)."""

from __future__ import annotations

import json

import pytest
import torch
from dist_harness import run_ranks
from safetensors import safe_open
from safetensors.torch import load_file

from helpers import FIXTURES, fixture_script

UNIVERSAL = FIXTURES / "deepspeed_universal" / "3_2_fp32"
ZERO = {stage: FIXTURES / "deepspeed" / f"{stage}_2_fp32" for stage in (1, 2, 3)}
GROUPED = FIXTURES / "deepspeed" / "2_2_fp32_groups"  # two param groups: rank 1's moments carry DeepSpeed's padding
GLOBAL_BATCH = {UNIVERSAL: 2}  # DeepSpeed's continuation: 1 rank x 2 for the universal one, else 2 ranks x 2
ds_fixtures = fixture_script("make_deepspeed_fixtures")


def _engine(stage: int, offload: bool | str = False, micro: int = 2, model=None, bf16: bool = False,
            clipping: float | None = None, groups: bool = False):
    """`offload`: True for host memory, or a folder for NVMe-backed states; `clipping`: else the default's."""
    import zero_core.deepspeed as deepspeed

    torch.manual_seed(0)
    model = model or ds_fixtures.Tiny()
    model.norm.weight.requires_grad_(False)
    where = {"device": "nvme", "nvme_path": offload} if isinstance(offload, str) else {"device": "cpu"}
    zero = {"stage": stage, **({"offload_optimizer": where} if offload else {})}
    cfg = {"train_micro_batch_size_per_gpu": micro, "zero_optimization": zero,
           "optimizer": {"type": "AdamW", "params": {"lr": 0.05, "weight_decay": 0.01}}, "bf16": {"enabled": bf16},
           **({} if clipping is None else {"gradient_clipping": clipping})}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=ds_fixtures.trainable(model, groups), config=cfg)
    return engine


def _resume_and_train(rank: int, world: int, stage: int, offload: bool | str, source=UNIVERSAL) -> dict:
    """Resume `source`, then DeepSpeed's continuation batches, each split over the ranks."""
    size = GLOBAL_BATCH.get(source, 4)
    engine = _engine(stage, offload, micro=size // world, groups=source == GROUPED)
    folder, client = engine.load_checkpoint(source)
    out = {"steps": engine.global_steps, "folder": str(folder), "client": client, "losses": []}
    gen = torch.Generator().manual_seed(ds_fixtures.CONTINUE_SEED)
    for _ in range(ds_fixtures.CONTINUE_STEPS):
        batch = torch.randint(0, 11, (size, 5), generator=gen)
        loss = engine(batch[rank * size // world : (rank + 1) * size // world])
        engine.backward(loss)
        engine.step()
        out["losses"].append(float(loss.detach()))
    out["state"], out["after"] = engine.full_state_dict(), engine.global_steps
    engine.close()
    return out


def _deepspeeds(source=UNIVERSAL) -> tuple[dict, list[float]]:
    path = source / "continued.safetensors"
    with safe_open(str(path), "pt") as f:
        losses = json.loads(f.metadata()["losses"])
    return load_file(str(path)), losses


@pytest.mark.parametrize("stage, offload", [(1, False), (2, False), (3, False), (3, "nvme")])
def test_a_universal_checkpoint_resumes_and_trains_on_as_deepspeed_does(stage, offload, tmp_path):
    got = _resume_and_train(0, 1, stage, str(tmp_path) if offload == "nvme" else False)
    want, losses = _deepspeeds()
    assert got["steps"] == 2 and got["after"] == 4 and got["folder"] == str(
        UNIVERSAL / "global_step2_universal" / "zero_pp_rank_0_mp_rank_00_model_states.pt")
    assert got["losses"] == pytest.approx(losses, rel=1e-6)
    for name, w in want.items():
        assert torch.allclose(got["state"][name], w, rtol=0, atol=1e-6), name


@pytest.mark.parametrize("saved, stage", [(1, 3), (2, 2), (3, 1)])
def test_a_zero_checkpoint_resumes_at_another_stage_and_trains_on_as_deepspeed_does(saved, stage):
    got = _resume_and_train(0, 1, stage, False, ZERO[saved])
    want, losses = _deepspeeds(ZERO[saved])
    model_file = "zero_pp_rank_0_mp_rank_00_model_states.pt" if saved == 3 else "mp_rank_00_model_states.pt"
    assert got["steps"] == 2 and got["after"] == 4 and got["folder"] == str(ZERO[saved] / "global_step2" / model_file)
    assert got["losses"] == pytest.approx(losses, rel=1e-6)
    for name, w in want.items():
        assert torch.allclose(got["state"][name], w, rtol=0, atol=1e-6), name


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_a_checkpoint_of_two_param_groups_resumes_and_trains_on_as_deepspeed_does(stage):
    """ZeRO-2 on 2 ranks, weight decay off for biases and norms: the second group's moments are saved with the
    alignment padding its fp32 partition is saved without."""
    got = _resume_and_train(0, 1, stage, False, GROUPED)
    want, losses = _deepspeeds(GROUPED)
    assert got["steps"] == 2 and got["after"] == 4
    assert got["losses"] == pytest.approx(losses, rel=1e-6)
    for name, w in want.items():
        assert torch.allclose(got["state"][name], w, rtol=0, atol=1e-6), name


@pytest.mark.slow
@pytest.mark.parametrize("source, stage, offload", [(UNIVERSAL, 2, True), (UNIVERSAL, 3, False), (ZERO[2], 3, True),
                                                    (ZERO[3], 2, False)])
def test_on_two_ranks(source, stage, offload):
    got = run_ranks(_resume_and_train, 2, stage, offload, source)
    want, _ = _deepspeeds(source)
    for name, w in want.items():
        assert torch.allclose(got["state"][name], w, rtol=0, atol=1e-6), name


def test_weights_only_takes_the_fp32_weights_and_keeps_the_counters():
    engine = _engine(2)
    engine.load_checkpoint(UNIVERSAL, load_module_only=True)
    state = engine.full_state_dict()
    engine.close()
    assert engine.global_steps == 0
    fp32 = torch.load(UNIVERSAL / "global_step2_universal" / "zero" / "lin1.weight" / "fp32.pt", weights_only=True)
    fp32 = fp32["param"] if isinstance(fp32, dict) else fp32
    assert torch.equal(state["lin1.weight"], fp32.reshape(state["lin1.weight"].shape))
    for source in (UNIVERSAL, ZERO[2]):  # without the optimizer states DeepSpeed still takes the run's counters
        engine = _engine(2)
        folder, _ = engine.load_checkpoint(source, load_optimizer_states=False)
        assert isinstance(folder, str) and (engine.global_steps, engine.global_samples) == (2, 4)
        assert engine.applied_steps() == 0 and float(engine.optimizer.applied) == 0.0  # this optimizer's own count
        engine.close()


@pytest.mark.parametrize("saved", ["1_2_bf16", "3_2_bf16"])
def test_a_bf16_runs_masters_and_moments_are_taken(saved):
    """The fp32 masters equal DeepSpeed's own consolidation of the checkpoint (expected_fp32.safetensors), and the
    moments are the run's (non-zero after its 2 steps), in a bf16 engine."""
    from zero_core.deepspeed.utils import safe_get_full_optimizer_state

    folder = FIXTURES / "deepspeed" / saved
    engine = _engine(2, bf16=True)
    engine.load_checkpoint(folder)
    state = engine.full_state_dict()
    want = load_file(str(folder / "expected_fp32.safetensors"))
    for name in ("emb.weight", "lin1.weight", "lin2.bias"):
        assert torch.equal(state[name], want[name]), name
        assert float(safe_get_full_optimizer_state(engine.module.get_parameter(name), "exp_avg_sq").sum()) > 0
    assert engine.global_steps == 2
    model_state = load_file(str(folder / "expected_model.safetensors"))  # DeepSpeed keeps its fp32 buffer fp32
    mix = engine.module.get_buffer("mix")
    assert model_state["mix"].dtype == torch.float32 and torch.equal(mix, model_state["mix"])
    engine.close()


def test_a_corrupted_rank_file_is_one_line(tmp_path):
    import shutil

    from checkpoint_helpers import flip_tensor_byte
    from checkpoints.source import CheckpointError

    copy = tmp_path / "2_2_fp32"
    shutil.copytree(ZERO[2], copy)
    flip_tensor_byte(copy / "global_step2" / "zero_pp_rank_1_mp_rank_00_optim_states.pt")
    engine = _engine(2)
    with pytest.raises(CheckpointError) as e:
        engine.load_checkpoint(copy)
    assert "zero_pp_rank_1_mp_rank_00_optim_states.pt is corrupt" in str(e.value) and "\n" not in str(e.value)
    engine.close()


@pytest.mark.parametrize("folder, words", [
    ("dcp/plain", ["does not hold this model", "lin1.bias"]),  # FSDP2's, of another model
    ("deepspeed/2_2_fp32", ["does not hold this model", "lin1.bias"]),  # DeepSpeed's, of another model
])
def test_another_tools_or_models_checkpoint_is_one_line_and_changes_nothing(folder, words):
    from checkpoints.source import CheckpointError

    model = ds_fixtures.Tiny()
    model.lin1 = torch.nn.Linear(7, 13, bias=False)  # lin1.bias is missing
    engine = _engine(2, model=model)
    before = engine.full_state_dict()
    with pytest.raises(CheckpointError) as e:
        engine.load_checkpoint(FIXTURES / folder)
    message = str(e.value)
    assert all(w in message for w in words) and "\n" not in message
    assert all(torch.equal(v, engine.full_state_dict()[k]) for k, v in before.items())  # nothing was changed
    engine.close()


def test_a_universal_checkpoint_missing_a_moment_is_one_line_and_changes_nothing(tmp_path):
    import shutil

    from checkpoints.source import CheckpointError

    copy = tmp_path / "3_2_fp32"
    shutil.copytree(UNIVERSAL, copy)
    (copy / "global_step2_universal" / "zero" / "lin2.bias" / "exp_avg_sq.pt").unlink()
    engine = _engine(2)
    before = engine.full_state_dict()
    with pytest.raises(CheckpointError) as e:
        engine.load_checkpoint(copy)
    message = str(e.value)
    assert "lin2.bias/exp_avg_sq.pt" in message and "load_optimizer_states=False" in message and "\n" not in message
    assert all(torch.equal(v, engine.full_state_dict()[k]) for k, v in before.items())
    engine.load_checkpoint(copy, load_optimizer_states=False)  # the fix the line names
    assert torch.equal(engine.full_state_dict()["lin2.bias"], _deepspeeds_weights_at_save("lin2.bias"))
    engine.close()


def _deepspeeds_weights_at_save(name: str) -> torch.Tensor:
    t = torch.load(UNIVERSAL / "global_step2_universal" / "zero" / name / "fp32.pt", weights_only=True)
    return (t["param"] if isinstance(t, dict) else t).float()


def test_the_saved_groups_weight_decay_and_eps_come_back(tmp_path):
    """DeepSpeed's optimizer state holds its param_groups, and its load puts them back: a weight_decay or eps the
    run's loop changed (0.25, 1e-3 here, written into the saved groups) is what the groups hold after the load."""
    import shutil

    from deepspeed_crafting import patch

    folder = tmp_path / "ckpt"
    shutil.copytree(ZERO[2], folder)
    for path in (folder / (folder / "latest").read_text().strip()).glob("*optim_states.pt"):
        patch(path, "weight_decay", 0.25)
        patch(path, "eps", 1e-3)
    engine = _engine(2)
    engine.load_checkpoint(folder)
    group = engine.optimizer.param_groups[0]
    assert (group["weight_decay"], group["eps"]) == (0.25, 1e-3)
    weights_only = _engine(2)
    weights_only.load_checkpoint(folder, load_optimizer_states=False)  # no optimizer state taken: the config's
    assert weights_only.optimizer.param_groups[0]["weight_decay"] == 0.01
    engine.close()
    weights_only.close()
