"""Evaluation sums kept on the device and reduced once: loss, accuracy, F1 counts, BLEU statistics, per task.

Every quantity is a sum over valid rows (or tokens), so ranks can add theirs with one all-reduce and
the padded rows of the last global batch count for nothing. BLEU (seq2seq on real text) adds corpus
BLEU's n-gram and length counts of each batch's greedy outputs (`generation.py`), so the reduced sum
gives sacrebleu's corpus BLEU over every rank's rows.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from . import metrics

# sums: loss over rows, rows, correct, counted (rows or tokens), tp, fp, fn
_N = 7


class EvalSums:
    def __init__(self, task: str, device: torch.device, bleu: bool = False) -> None:
        self.task = task
        self.sums = torch.zeros(_N + (metrics.BLEU_STATS if bleu else 0), dtype=torch.float64, device=device)
        self.bleu = bleu

    def add(self, logits: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor) -> None:
        """One micro-batch: logits [B, C] or [B, T, C], labels [B] or [B, T] (-100 = ignore)."""
        valid = valid.to(logits.device)
        logits = logits.float()
        if logits.dim() == 2:  # sequence classification
            row_loss = F.cross_entropy(logits, labels, reduction="none")
            pred = logits.argmax(-1)
            ok = (pred == labels) & valid
            self._acc(row_loss, valid, ok.sum(), valid.sum())
            pos, true = (pred == 1) & valid, (labels == 1) & valid
            self.sums[4] += (pos & true).sum()
            self.sums[5] += (pos & ~true).sum()
            self.sums[6] += (~pos & true & valid).sum()
            return
        tok_loss = F.cross_entropy(logits.transpose(1, 2), labels, reduction="none", ignore_index=-100)
        counted = (labels != -100) & valid[:, None]
        row_loss = (tok_loss * counted).sum(1) / counted.sum(1).clamp(min=1)
        ok = (logits.argmax(-1) == labels) & counted
        self._acc(row_loss, valid, ok.sum(), counted.sum())

    def add_texts(self, hypotheses: list[str], references: list[str]) -> None:
        """Generated and reference texts of one micro-batch's valid rows (BLEU)."""
        assert self.bleu, "EvalSums(bleu=True) keeps the BLEU statistics"
        self.sums[_N:] += torch.tensor(metrics.bleu_stats(hypotheses, references), dtype=torch.float64,
                                       device=self.sums.device)

    def _acc(self, row_loss: torch.Tensor, valid: torch.Tensor, correct: torch.Tensor, counted: torch.Tensor) -> None:
        self.sums[0] += (row_loss.double() * valid).sum()
        self.sums[1] += valid.sum()
        self.sums[2] += correct
        self.sums[3] += counted

    def result(self) -> dict[str, float]:
        """All-reduce the sums (collective) and derive the task's metrics."""
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(self.sums)
        loss_sum, rows, correct, counted, tp, fp, fn, *bleu_stats = (float(x) for x in self.sums.cpu())
        loss = loss_sum / rows if rows else float("nan")
        out = {"loss": loss}
        if self.task == "lm":
            out["perplexity"] = metrics.perplexity(loss)
        if self.task in ("classification", "token_classification"):
            out["accuracy"] = metrics.accuracy(correct, counted)
        if self.task == "classification":
            out["f1"] = metrics.f1_score(tp, fp, fn)
        if self.bleu:
            out["bleu"] = metrics.bleu(bleu_stats)
        return out
