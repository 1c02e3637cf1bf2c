"""Every derived number of the tables, computed here and nowhere else.

Training FLOPs per token follow the PaLM / nanoGPT count: 6N for the matmuls of forward and backward
over N parameters, plus 12 * L * d * T for attention scores and values (L layers, hidden size d,
sequence length T). TFLOP/s per GPU is that times the tokens each GPU processes per second.
"""

from __future__ import annotations

import math
from typing import Any, Sequence


def flops_per_token(n_params: int, layers: int, hidden: int, seq_len: int) -> float:
    """Training FLOPs per token: 6N + 12 * L * d * T."""
    return 6.0 * n_params + 12.0 * layers * hidden * seq_len


def tokens_per_s(tokens: int, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else float("nan")


def tflops_per_gpu(tokens_per_second: float, world_size: int, n_params: int, layers: int, hidden: int,
                   seq_len: int) -> float:
    """Achieved TFLOP/s on each GPU (the whole job's tokens/s split evenly over the ranks)."""
    return tokens_per_second / world_size * flops_per_token(n_params, layers, hidden, seq_len) / 1e12


def perplexity(loss: float) -> float:
    return math.exp(min(loss, 50.0))  # capped: an untrained model's exp(loss) overflows nothing useful


def f1_score(tp: float, fp: float, fn: float) -> float:
    """F1 of the positive class (MRPC's "paraphrase")."""
    denom = 2 * tp + fp + fn
    return 2 * tp / denom if denom else 0.0


def accuracy(correct: float, total: float) -> float:
    return correct / total if total else float("nan")


BLEU_STATS = 10  # matches and totals for n = 1..4, hypothesis length, reference length


def _bleu() -> Any:
    from sacrebleu.metrics import BLEU

    return BLEU()  # sacrebleu's defaults: 13a tokenizer, exp smoothing, up to 4-grams


def bleu_stats(hypotheses: Sequence[str], references: Sequence[str]) -> list[float]:
    """Corpus BLEU's sufficient statistics for these pairs (one reference each). They add up, so ranks and
    batches sum theirs and `bleu` of the sum equals sacrebleu's corpus BLEU of all pairs together."""
    if not hypotheses:
        return [0.0] * BLEU_STATS
    s = _bleu().corpus_score(list(hypotheses), [list(references)])
    return [*map(float, s.counts), *map(float, s.totals), float(s.sys_len), float(s.ref_len)]


def bleu(stats: Sequence[float]) -> float:
    """sacrebleu's corpus BLEU (0-100) from summed `bleu_stats`."""
    b = _bleu()
    counts, totals = [int(x) for x in stats[:4]], [int(x) for x in stats[4:8]]
    return b.compute_bleu(counts, totals, int(stats[8]), int(stats[9]), smooth_method=b.smooth_method,
                          smooth_value=b.smooth_value, effective_order=b.effective_order,
                          max_ngram_order=b.max_ngram_order).score


def loss_parity(losses: Sequence[float], reference: Sequence[float]) -> float:
    """Largest per-step |loss - reference loss| over the steps both runs have."""
    n = min(len(losses), len(reference))
    return max((abs(a - b) for a, b in zip(losses[:n], reference[:n])), default=float("nan"))


def gib(n_bytes: float) -> float:
    return n_bytes / 2**30
