"""A small GPT (minGPT-style decoder) built from a config: the workbench's default model.

Plain PyTorch, no parallelism. The output head is tied to the token embedding, as in GPT-2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .sliced_loss import sliced_cross_entropy, worth_slicing


# Valid values of each GPTConfig field (inclusive; dropout is a probability below 1). Generous: GPT-3 175B
# has 96 layers of width 12,288; the bounds only keep a typo from becoming an allocation of exabytes.
GPT_RANGES: dict[str, tuple[int, int]] = {"vocab_size": (1, 10_000_000), "block_size": (1, 1 << 20),
                                          "n_layer": (1, 10_000), "n_head": (1, 65_536), "n_embd": (1, 1 << 20)}


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 50257
    block_size: int = 1024
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0

    def num_params(self) -> int:
        """Parameter count (tied head counted once)."""
        d, v, t = self.n_embd, self.vocab_size, self.block_size
        per_layer = 12 * d * d + 13 * d
        return v * d + t * d + self.n_layer * per_layer + 2 * d


@dataclass
class LMOutput:
    """What `GPT.forward` returns: next-token logits and, given targets, the mean cross-entropy."""

    logits: torch.Tensor | None  # None when training computed the loss slice by slice (sliced_loss.py)
    loss: torch.Tensor | None = None


class SelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        assert cfg.n_embd % cfg.n_head == 0, "n_embd must be divisible by n_head"
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = SelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.head.weight = self.wte.weight
        self.gradient_checkpointing = False
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):  # GPT-2's scaled init of residual projections
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layer))

    def gradient_checkpointing_enable(self) -> None:
        """Keep only each block's input during training and recompute the block in backward (the name
        Hugging Face models use): activation memory per block drops to one (batch, seq, n_embd) tensor
        for about a third more compute."""
        self.gradient_checkpointing = True

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> LMOutput:
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        x = self.ln_f(x)
        if targets is not None and self.training and torch.is_grad_enabled() and worth_slicing(
            targets.numel(), self.cfg.vocab_size
        ):  # training needs only the loss: the full logits are never materialised
            return LMOutput(None, sliced_cross_entropy(self.head, x, targets))
        logits = self.head(x)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
        return LMOutput(logits, loss)
