"""Rank functions for the sharded-initialisation tests (spawned by dist_harness.run_ranks)."""

from __future__ import annotations

import torch

import zero_core
from zbench.host_memory import peak_rss_bytes, rss_bytes
from zbench.models.gpt import GPT, GPTConfig

SMALL = GPTConfig(vocab_size=96, block_size=16, n_layer=2, n_head=2, n_embd=32)
# ~38 M parameters: 151 MB of fp32 weights, far above the noise of a process's resident set
LARGE = GPTConfig(vocab_size=256, block_size=32, n_layer=12, n_head=8, n_embd=512)


def ds(stage: int, **zero) -> dict:
    return {"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 0.0,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": stage, **zero}}


def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=96, n_positions=16, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg)


def tiny_blenderbot():
    """Tied embeddings (shared, encoder, decoder, lm_head) and a padding row zeroed in place at init."""
    from transformers import BlenderbotConfig, BlenderbotForConditionalGeneration

    cfg = BlenderbotConfig(vocab_size=96, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                           decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                           max_position_embeddings=16, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                           decoder_start_token_id=0, tie_word_embeddings=True)
    return BlenderbotForConditionalGeneration(cfg)


def build(kind: str) -> torch.nn.Module:
    return {"gpt": lambda: GPT(SMALL), "gpt2": tiny_gpt2, "blenderbot": tiny_blenderbot}[kind]()


def sharded_state(rank: int, world: int, kind: str, stage: int) -> dict:
    """Every rank seeds differently (rank 0's construction counts, as eager training broadcasts rank 0's
    weights); the model is built inside init_context; returns the full state dict and the next random draw."""
    torch.manual_seed(100 + rank)
    with zero_core.init_context(ds(stage)):
        model = build(kind)
    on_meta = all(p.device.type == "meta" for p in model.parameters())
    engine = zero_core.initialize(model, ds(stage))
    state = {k: v.cpu() for k, v in engine.full_state_dict().items()}
    after = torch.randn(4)
    x = torch.randint(0, 96, (1, 8)).to(engine.device)  # the rank's GPU under ZB_TEST_DEVICE=cuda
    loss = engine(x, x).loss if kind == "gpt" else engine(input_ids=x, labels=x).loss
    engine.backward(loss)
    engine.step()
    tied = kind == "blenderbot" and model.get_output_embeddings().weight is model.get_input_embeddings().weight
    return {"state": state, "after": after, "on_meta": on_meta, "loss": float(loss.detach()), "tied": tied}


def _reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as f:  # "5" resets VmHWM to the current resident set
        f.write("5")


def large_under_limit(rank: int, world: int, nvme_dir: str) -> dict:
    """Build LARGE sharded, train two steps; the growth of this rank's peak resident set over the whole
    time must stay below the model's fp32 size, the memory a rank is allowed here."""
    torch.manual_seed(0)
    cfg = ds(3, offload_param={"device": "cpu"},
             offload_optimizer={"device": "nvme", "nvme_path": nvme_dir, "buffer_count": 2})
    cfg["bf16"] = {"enabled": True}
    # each block released after its forward: DeepSpeed's default reuse distance would keep the model's blocks
    # (up to 1e9 elements) between forward and backward, which is what it is for, not what this bounds
    cfg["zero_optimization"]["stage3_max_reuse_distance"] = 0
    _train(SMALL, cfg, rank, steps=1)  # first use imports and sets up what any run needs; not measured
    _reset_peak_rss()  # the peak of that first use must not count as growth of the large model
    start = rss_bytes()
    init_peak, losses, engine = _train(LARGE, cfg, rank, steps=2, start=start)
    peak = peak_rss_bytes() - start
    return {"init_growth": init_peak, "growth": peak, "fp32_bytes": 4 * LARGE.num_params(), "losses": losses,
            "layout_numel": engine.layout.partition_numel}


def _train(shape: GPTConfig, cfg: dict, rank: int, steps: int, start: int = 0):
    with zero_core.init_context(cfg):
        model = GPT(shape)
    engine = zero_core.initialize(model, cfg)
    init_peak = peak_rss_bytes() - start
    g = torch.Generator().manual_seed(rank)
    losses = []
    for _ in range(steps):
        x = torch.randint(0, shape.vocab_size, (1, 16), generator=g)
        loss = engine(x, x).loss
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    engine.close()
    return init_peak, losses, engine


def pretrained_state(rank: int, world: int, folder: str, nvme_dir: str | None) -> dict:
    """Build tiny GPT-2 sharded and load `folder` (written by save_pretrained) at stage 3."""
    torch.manual_seed(5 + rank)
    zero = {"offload_optimizer": {"device": "nvme", "nvme_path": nvme_dir, "buffer_count": 2}} if nvme_dir else {}
    cfg = ds(3, **zero)
    with zero_core.init_context(cfg):
        model = tiny_gpt2()
    engine = zero_core.initialize(model, cfg, pretrained=folder)
    return {"state": engine.full_state_dict()}


def param_offload_losses(rank: int, world: int, device: str, nvme_dir: str) -> dict:
    """Train SMALL at stage 3 with parameter offload to `device` (cpu or nvme) and optimizer offload to host."""
    offload = {"device": device, **({"nvme_path": nvme_dir} if device == "nvme" else {})}
    cfg = ds(3, offload_param=offload, offload_optimizer={"device": "cpu"}, stage3_param_persistence_threshold=0)
    cfg["bf16"] = {"enabled": True}
    torch.manual_seed(1)
    with zero_core.init_context(cfg):
        model = GPT(SMALL)
    engine = zero_core.initialize(model, cfg)
    g = torch.Generator().manual_seed(rank)
    losses = []
    for _ in range(3):
        x = torch.randint(0, SMALL.vocab_size, (2, 12), generator=g)
        loss = engine(x, x).loss
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    mapped = engine.strategy.local.untyped_storage().filename if device == "nvme" else None
    return {"losses": losses, "state": engine.full_state_dict(), "mapped": mapped}


def seeds_only_on_rank1(rank: int, world: int) -> dict:
    """Rank 1 sets a seed while building, rank 0 does not: every rank must get the same one-line error."""
    with zero_core.init_context(ds(3)):
        if rank == 1:
            torch.manual_seed(5)
        model = torch.nn.Linear(8, 8)
    try:
        zero_core.initialize(model, ds(3))
    except RuntimeError as e:
        return {"error": str(e)}
    return {"error": None}
