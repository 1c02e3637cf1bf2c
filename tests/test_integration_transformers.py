"""ZeroTrainer (zero_core.integrations.transformers) against Hugging Face's Trainer with torch DDP: 2 gloo ranks,
fp32, tiny GPT-2 and BERT built from transformers' config classes, seed DeepSpeed configs verbatim ("auto"
and all). Losses within 1e-5 at stages 1-3 (eval losses too); a resume from checkpoint-N on 1 rank at another
stage continues the same curve; save_model() opens with from_pretrained and equals full_state_dict()."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import trainer_workers as tw  # noqa: E402
from dist_harness import run_ranks  # noqa: E402

pytestmark = pytest.mark.slow  # spawned ranks or whole runs: outside the fast tier (-m 'not slow')

TOL = 1e-5


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.slow
@pytest.mark.parametrize("kind,seed_config", [
    ("gpt2", "003_zero1.json"),                          # stage 1; Trainer's AdamW groups and linear schedule
    ("gpt2", "001_kaggle_longformer_ds_config_dict.json"),  # stage 2, optimizer offload; config AdamW + WarmupLR
    ("bert", "001_kaggle_longformer_ds_config_dict.json"),  # a loss the model averages itself (no loss kwargs)
    ("gpt2", "003_ds_config_zero3_notebook.json"),       # stage 3, parameter and optimizer offload
])
def test_zero_trainer_equals_ddp_trainer(tmp_path, kind, seed_config):
    got = run_ranks(tw.parity, 2, kind, seed_config, str(tmp_path), {})
    ddp, zero = got["ddp"], got["zero"]
    assert len(zero["losses"]) == 16 and zero["losses"] == pytest.approx(ddp["losses"], abs=TOL)
    assert len(zero["eval"]) == 2 and zero["eval"] == pytest.approx(ddp["eval"], abs=TOL)
    assert _max_diff(zero["weights"], ddp["weights"]) < 1e-4  # after 8 Adam updates at lr 1e-2
    # save_model(): a folder from_pretrained opens, holding exactly the engine's weights
    assert _max_diff(zero["loaded"], zero["weights"]) == 0.0
    if kind == "gpt2":  # tied weights stored once, as save_pretrained stores them
        from safetensors import safe_open

        with safe_open(str(tmp_path / "saved" / "model.safetensors"), "pt") as f:
            assert "transformer.wte.weight" in f.keys() and "lm_head.weight" not in f.keys()
    assert json.loads((tmp_path / "saved" / "config.json").read_text())["model_type"] == kind


@pytest.mark.slow
def test_resume_on_one_rank_at_another_stage(tmp_path):
    first = str(tmp_path / "two_ranks")
    saving = {"save_strategy": "steps", "save_steps": 4, "eval_strategy": "no"}
    a = run_ranks(tw.run, 2, "zero", "gpt2", "001_kaggle_longformer_ds_config_dict.json", first, saving)
    checkpoint = tmp_path / "two_ranks" / "checkpoint-4"
    assert (checkpoint / "latest").read_text().strip() == "global_step4"  # a zbench checkpoint inside checkpoint-N/
    assert (checkpoint / "trainer_state.json").is_file() and (checkpoint / "model.safetensors").is_file()
    b = run_ranks(tw.run, 1, "zero", "gpt2", "003_ds_config_zero3_notebook.json", str(tmp_path / "one_rank"),
                  {"eval_strategy": "no"}, str(checkpoint))
    assert len(a["losses"]) == 16 and len(b["losses"]) == 8
    assert b["losses"] == pytest.approx(a["losses"][8:], abs=TOL)
    assert _max_diff(b["weights"], a["weights"]) < 1e-4


def test_arguments_hide_the_config_from_transformers(tmp_path):
    from zero_core.integrations.transformers import TrainingArguments, ZeroTrainer

    args = TrainingArguments(output_dir=str(tmp_path), deepspeed=str(tw.SEEDS / "003_zero1.json"), use_cpu=True,
                             report_to=[])
    assert args.deepspeed is None and args.zero_config.endswith("003_zero1.json")
    assert getattr(args, "deepspeed_plugin", None) is None  # transformers' DeepSpeed path stays off
    trainer = ZeroTrainer(model=tw.tiny_model("gpt2"), args=args, train_dataset=tw.Samples("gpt2", 8, 1))
    assert not trainer.is_deepspeed_enabled


def test_refusals_name_the_fix(tmp_path):
    import transformers

    from zero_core.integrations.transformers import ZeroTrainer

    plain = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    with pytest.raises(ValueError, match="deepspeed='ds_config.json'"):
        ZeroTrainer(model=tw.tiny_model("gpt2"), args=plain)


def _trainer(tmp_path, seed_config: str, **extra):
    from zero_core.integrations.transformers import TrainingArguments, ZeroTrainer

    args = TrainingArguments(output_dir=str(tmp_path / "out"), deepspeed=str(tw.SEEDS / seed_config), use_cpu=True,
                             report_to=[], per_device_train_batch_size=2, max_steps=2, save_strategy="no",
                             **extra.pop("args", {}))
    return ZeroTrainer(model=tw.tiny_model("gpt2"), args=args, train_dataset=tw.Samples("gpt2", 4, 1), **extra)


def test_resume_from_a_folder_plain_trainer_wrote_is_refused(tmp_path):
    """A checkpoint-N of transformers.Trainer without DeepSpeed holds no engine state: refused, not started afresh
    while Trainer's state skips the saved steps (as HF with DeepSpeed refuses it)."""
    from transformers.trainer_callback import TrainerState

    plain = tmp_path / "checkpoint-8"
    tw.tiny_model("gpt2").save_pretrained(str(plain))
    TrainerState(global_step=8, max_steps=16, train_batch_size=2).save_to_json(str(plain / "trainer_state.json"))
    for name in ("optimizer.pt", "scheduler.pt"):
        (plain / name).write_bytes(b"")
    with pytest.raises(ValueError, match=r"checkpoint-8' holds .*model.safetensors, optimizer.pt, scheduler.pt, "
                                         r"trainer_state.json but no zbench or DeepSpeed checkpoint.*from_pretrained"):
        _trainer(tmp_path, "003_zero1.json").train(resume_from_checkpoint=str(plain))


def test_optimizer_refusals_name_trainers_arguments(tmp_path):
    """Refusals name what a Trainer user set (optimizers=, optim=), not initialize() or engine config keys."""
    model = tw.tiny_model("gpt2")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with pytest.raises(ValueError, match=r"Trainer\(optimizers=\.\.\.\) got an optimizer and the DeepSpeed config "
                                         r"has its own 'optimizer' section"):
        _trainer(tmp_path, "001_kaggle_longformer_ds_config_dict.json", optimizers=(opt, None)).train()
    with pytest.raises(ValueError, match=r"^TrainingArguments\(optim='adafactor'\) gives Adafactor.*optim='adamw_torch'"
                       ) as refused:
        _trainer(tmp_path, "003_zero1.json", args={"optim": "adafactor"}).train()
    assert "zero_allow_untested_optimizer" not in str(refused.value) and "\n" not in str(refused.value)
