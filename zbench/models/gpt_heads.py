"""Task heads on zbench's GPT (the model itself stays a plain language model)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .gpt import GPT, GPTConfig, LMOutput


class GPTForSequenceClassification(nn.Module):
    """GPT body + a linear head on the hidden state of the last real token (GPT-2's recipe).

    Attention is causal, so that token has seen the whole pair and padding after it changes nothing.
    The tied LM head stays unused; its weight is the token embedding, which the body uses.
    """

    def __init__(self, cfg: GPTConfig, num_labels: int = 2) -> None:
        super().__init__()
        self.gpt = GPT(cfg)
        self.score = nn.Linear(cfg.n_embd, num_labels, bias=False)
        nn.init.normal_(self.score.weight, std=0.02)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None) -> LMOutput:
        g = self.gpt
        t = input_ids.shape[1]
        x = g.wte(input_ids) + g.wpe(torch.arange(t, device=input_ids.device))
        for block in g.blocks:
            x = block(x)
        h = g.ln_f(x)
        if attention_mask is None:
            last = torch.full((input_ids.shape[0],), t - 1, device=input_ids.device)
        else:
            last = attention_mask.sum(dim=1).clamp(min=1) - 1
        logits = self.score(h[torch.arange(h.shape[0], device=h.device), last])
        loss = F.cross_entropy(logits.float(), labels) if labels is not None else None
        return LMOutput(logits, loss)
