"""Stage 3, two ranks: a script calls a submodule of the model directly, outside the model's own forward, as
transformers' `generate()` calls `model.get_encoder()(...)` and a custom loss calls `model.body(...)` then
`model.head(...)`. Each call gathers what it reads (on every rank: all make the same calls), releases it as the
model's forward would, and with autograd on, its backward trains as the model's forward does (stage 2's
weights, DeepSpeed 0.19.8's losses). Nothing is persistent, so every unit really is released between calls."""

from __future__ import annotations

import copy

import pytest
import torch
from dist_harness import run_ranks
from torch import nn

ZERO3 = {"stage": 3, "stage3_param_persistence_threshold": 0, "stage3_max_live_parameters": 64,
         "stage3_prefetch_bucket_size": 0, "stage3_max_reuse_distance": 0}


class _Stack(nn.Module):
    """Embedding (shared with the other stack, in the root unit), two blocks (a unit each), a final norm."""

    def __init__(self, shared: nn.Embedding) -> None:
        super().__init__()
        self.embed = shared
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))
        self.norm = nn.LayerNorm(8)

    def forward(self, ids: torch.Tensor, memory: torch.Tensor | None = None) -> torch.Tensor:
        h = self.embed(ids)
        if memory is not None:
            h = h + memory.mean(dim=1, keepdim=True)
        for b in self.blocks:
            h = torch.tanh(b(h))
        return self.norm(h)


class _EncDec(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Embedding(16, 8)
        self.encoder = _Stack(self.shared)
        self.decoder = _Stack(self.shared)
        self.head = nn.Linear(8, 16)

    def get_encoder(self) -> nn.Module:
        return self.encoder

    def forward(self, ids: torch.Tensor, dec_ids: torch.Tensor, memory: torch.Tensor | None = None) -> torch.Tensor:
        if memory is None:
            memory = self.encoder(ids)
        return self.head(self.decoder(dec_ids, memory))


def _engine(model: nn.Module, zero: dict):
    import zero_core.deepspeed as deepspeed

    cfg = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": zero,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    return engine


def _held(engine) -> list[int]:
    """The units gathered now."""
    return [g for g, b in enumerate(engine.strategy.gatherer.full) if b.untyped_storage().size() > 0]


def _hooked(model: nn.Module) -> list[str]:
    """The model's modules with a forward pre-hook."""
    return [n or "<root>" for n, m in model.named_modules() if m._forward_pre_hooks]


def _evaluate(rank: int, world: int) -> dict:
    """The encoder called directly without grad, then the model's forward on its output: as the plain model."""
    torch.manual_seed(0)
    model = _EncDec()
    plain = copy.deepcopy(model)
    engine = _engine(model, ZERO3)
    ids, dec = torch.randint(0, 16, (2, 5)), torch.randint(0, 16, (2, 3))
    during: list[list[int]] = []
    model.encoder.blocks[1].register_forward_pre_hook(lambda *_: during.append(_held(engine)))
    hooked_before = _hooked(model)
    with torch.no_grad():
        memory = model.get_encoder()(ids)
        after_first = _held(engine)
        hooked_after = _hooked(model)
        memory = model.get_encoder()(ids)  # now hooked: this call gives back what it borrowed as it returns
        after_encoder = _held(engine)
        logits = engine(ids, dec, memory=memory)
        head_only = model.head(memory)  # head's first direct call: the root unit it borrows stays for now
        end = _held(engine)
        engine(ids, dec, memory=memory)  # the model's forward without grad: a release point
    with torch.no_grad():
        want_memory = plain.get_encoder()(ids)
        want, want_head = plain(ids, dec, memory=want_memory), plain.head(want_memory)
    return {"memory": (memory, want_memory), "logits": (logits, want), "head": (head_only, want_head),
            "during": during, "after_first": after_first, "after": after_encoder, "end": end,
            "released": _held(engine),
            "hooked": (hooked_before, hooked_after),
            "blocks": {n: engine.strategy.groups_of(list(m.parameters()))
                       for n, m in model.named_modules() if n.endswith("blocks.1")}}


def test_encoder_called_directly_without_grad_matches_the_plain_model():
    got = run_ranks(_evaluate, 2)
    for what in ("memory", "logits", "head"):
        mine, want = got[what]
        assert torch.allclose(mine, want, atol=1e-6), what
    # the first direct call finds the encoder on the stack and hooks it: what it borrowed (the root unit, the
    # shared embedding) goes back at the next release point; from then on, as each call returns
    assert got["after_first"] == [0]
    assert got["after"] == [] and got["end"] == [0] and got["released"] == []
    # inside the encoder's last block: the root unit and that block only, in both calls
    assert got["during"] == [[0] + got["blocks"]["encoder.blocks.1"]] * 2
    # hooks on the root and the units only (each hooked module costs every forward ~5 us), then on the encoder
    before, after = got["hooked"]
    assert before == ["<root>", "encoder.blocks.0", "encoder.blocks.1", "decoder.blocks.0", "decoder.blocks.1"]
    assert after == before[:1] + ["encoder"] + before[1:]


# DeepSpeed 0.19.8's rank-0 loss of each of 3 steps (tests/fixtures/make_stage3_submodule_losses.py: two CPU ranks
# over gloo, `_train`'s model, config, batches and direct calls, with the no_grad call between)
DEEPSPEED_LOSSES = [2.6468000411987305, 2.832944393157959, 2.7362148761749268]


class _Lm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = _Stack(nn.Embedding(16, 8))
        self.head = nn.Linear(8, 16)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(ids))


def _train(rank: int, world: int, stage: int, direct: bool, between: bool = False) -> dict:
    """3 steps of a loss from body then head: called directly (`direct`) or through the model's forward; with
    `between`, the body is called again without grad before the backward (a metric on the same batch)."""
    torch.manual_seed(0)
    model = _Lm()
    engine = _engine(model, ZERO3 if stage == 3 else {"stage": stage})
    torch.manual_seed(1)
    losses, held = [], []
    for _ in range(3):
        ids = torch.randint(0, 16, (2 * world, 5))[2 * rank : 2 * rank + 2]
        logits = model.head(model.body(ids)) if direct else engine(ids)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten())
        if between:
            with torch.no_grad():
                model.body(ids)  # must not give back what the backward below reads
        engine.backward(loss)
        held.append(_held(engine) if stage == 3 else [])
        engine.step()
        losses.append(loss.item())
    return {"losses": losses, "weights": engine.full_state_dict(), "held": held}


@pytest.mark.parametrize("between", [False, True])
def test_loss_from_submodules_called_directly_trains_as_the_models_forward(between):
    direct, forward = run_ranks(_train, 2, 3, True, between), run_ranks(_train, 2, 2, False)
    assert direct["losses"] == pytest.approx(DEEPSPEED_LOSSES, abs=1e-6)
    assert direct["losses"] == pytest.approx(forward["losses"], abs=1e-6)
    for name, value in forward["weights"].items():
        assert torch.allclose(direct["weights"][name], value, atol=1e-6), name
    assert direct["held"] == [[], [], []]  # each backward gave back what the calls gathered


def _t5_generate(rank: int, world: int) -> dict:
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_decoder_layers=2, num_heads=2,
                   decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, initializer_factor=5.0)
    torch.manual_seed(0)
    model = T5ForConditionalGeneration(cfg).eval()
    plain = copy.deepcopy(model)
    engine = _engine(model, ZERO3)
    ids = torch.randint(2, 64, (2, 7))
    kwargs = {"max_new_tokens": 6, "do_sample": False, "num_beams": 1}
    with torch.no_grad():
        mine = model.generate(input_ids=ids, synced_gpus=True, **kwargs)
        want = plain.generate(input_ids=ids, **kwargs)
    return {"mine": mine, "want": want, "held": _held(engine)}


@pytest.mark.slow
def test_t5_generate_matches_the_plain_model():
    pytest.importorskip("transformers")
    got = run_ranks(_t5_generate, 2)
    assert torch.equal(got["mine"], got["want"])
    assert got["want"][0].tolist() != got["want"][1].tolist()  # the tokens depend on the input
    assert got["held"] == []
