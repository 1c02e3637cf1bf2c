"""zero_core's Seq2SeqTrainer (`predict_with_generate`, a tiny T5 built here) trains and generates as transformers'
own Seq2SeqTrainer does without DeepSpeed on one process: the same logged losses, eval loss and generated tokens, at
stages 2 and 3."""

from __future__ import annotations

import pytest
import torch
import transformers

from zero_core.integrations.transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

_CONFIG = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
           "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}}}


class _Reversal(torch.utils.data.Dataset):
    def __init__(self, n: int, seed: int) -> None:
        self.ids = torch.randint(2, 64, (n, 8), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(8, dtype=torch.long),
                "labels": self.ids[i].flip(0)[:6]}


def _run(tmp_path, trainer_cls, args_cls, **deepspeed) -> tuple[list[float], float, list]:
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_heads=2, decoder_start_token_id=0,
        pad_token_id=0, eos_token_id=1))
    args = args_cls(output_dir=str(tmp_path), per_device_train_batch_size=2, per_device_eval_batch_size=4,
                    learning_rate=1e-2, max_steps=3, logging_steps=1, save_strategy="no", report_to=[],
                    use_cpu=True, seed=0, predict_with_generate=True, generation_max_length=6,
                    optim="adamw_torch", **deepspeed)
    trainer = trainer_cls(model=model, args=args, train_dataset=_Reversal(8, 1), eval_dataset=_Reversal(4, 2))
    trainer.train()
    losses = [x["loss"] for x in trainer.state.log_history if "loss" in x]
    return losses, trainer.evaluate()["eval_loss"], trainer.predict(_Reversal(4, 3)).predictions.tolist()


@pytest.mark.parametrize("stage", [2, 3])
def test_seq2seq_trainer_trains_and_generates_as_transformers_own(tmp_path, stage):
    own = _run(tmp_path / "own", transformers.Seq2SeqTrainer, transformers.Seq2SeqTrainingArguments)
    config = {**_CONFIG, "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0}}
    mine = _run(tmp_path / "zero", Seq2SeqTrainer, Seq2SeqTrainingArguments, deepspeed=config)
    assert mine[0] == pytest.approx(own[0], rel=1e-5) and len(mine[0]) == 3
    assert mine[1] == pytest.approx(own[1], rel=1e-5)
    assert mine[2] == own[2]
