"""Seq2seq on real text: source/target pair files, greedy generation through a variant's forward, and BLEU
(equal to sacrebleu's corpus BLEU), per rank and end to end on 2 gloo ranks."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
from types import SimpleNamespace

import pytest
import torch
from sacrebleu import corpus_bleu

from helpers import FIXTURES, REPO, printed, refused_run, run_dir, table, write_scenario, zbench
from zbench import metrics
from zbench.data import build_splits
from zbench.data.pairs import encode, load_text_pairs, pick_columns, read_pairs
from zbench.data.tokenize import ByteTokenizer
from zbench.evaluation import EvalSums
from zbench.generation import TextGeneration, greedy_generate
from zbench.results import markdown

pytestmark = pytest.mark.slow  # spawned ranks or whole runs: outside the fast tier (-m 'not slow')

PAIRS = str(FIXTURES / "pairs_tiny")
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
needs_transformers = pytest.mark.skipif(
    not HAS_TRANSFORMERS, reason="the toy BlenderBot needs transformers (pip install -e '.[test]' installs it)"
)


def rows(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_pair_files_in_every_format_give_the_same_rows(tmp_path):
    src = rows(os.path.join(PAIRS, "train.jsonl"))
    want = [(r["context"], r["response"]) for r in src]
    with open(tmp_path / "p.csv", "w", newline="") as f:  # quoted fields with commas and quotes
        w = csv.writer(f)
        w.writerow(["id", "context", "response"])
        w.writerows([i, c, r] for i, (c, r) in enumerate(want))
    (tmp_path / "p.tsv").write_text("context\tresponse\n" + "".join(f"{c}\t{r}\n" for c, r in want))
    paths = [os.path.join(PAIRS, "train.jsonl"), str(tmp_path / "p.csv"), str(tmp_path / "p.tsv")]
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(
        pa.table({"context": [c for c, _ in want], "response": [r for _, r in want]}), tmp_path / "p.parquet"
    )
    paths.append(str(tmp_path / "p.parquet"))
    for p in paths:
        assert pick_columns(p, None, None) == ("context", "response")  # MuDoConv's names are a default pair
        assert read_pairs(p, "context", "response") == want


def test_encoding_ends_with_sep_and_ignores_label_padding():
    tok = ByteTokenizer()
    enc = encode([("hello", "hi there"), ("a" * 20, "b" * 20)], tok, 8, 6, prefix="> ")
    assert enc["input_ids"][0].tolist() == [*(b + 3 for b in b"> hello"), tok.sep_id]
    assert enc["attention_mask"][0].tolist() == [1] * 8
    assert enc["input_ids"][1, -1] == tok.sep_id and enc["labels"][1, -1] == tok.sep_id
    assert enc["labels"][0].tolist() == [*(b + 3 for b in b"hi th"), tok.sep_id]
    short = encode([("x", "y")], tok, 6, 4)
    assert short["input_ids"][0].tolist() == [ord("x") + 3, tok.sep_id, 0, 0, 0, 0]
    assert short["attention_mask"][0].tolist() == [1, 1, 0, 0, 0, 0]
    assert short["labels"][0].tolist() == [ord("y") + 3, tok.sep_id, -100, -100]


def test_columns_holdout_and_errors(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"q": "one", "a": "1"}\n{"q": "two", "a": "2"}\n\n{"q": "six", "a": "6"}\n')
    spec = {"train": "a.jsonl", "source_column": "q", "target_column": "a"}
    train, evals = load_text_pairs(spec, ByteTokenizer(), 8, 4, 0.34, lambda p: str(tmp_path / p))
    assert train["input_ids"].shape == (2, 8) and evals["labels"].tolist() == [[ord("6") + 3, 2, -100, -100]]
    with pytest.raises(ValueError, match="has columns q, a; name the text columns with source_column"):
        pick_columns(str(tmp_path / "a.jsonl"), None, None)
    with pytest.raises(ValueError, match="column 'answer' is not in it"):
        pick_columns(str(tmp_path / "a.jsonl"), "q", "answer")
    (tmp_path / "b.jsonl").write_text('{"source": "s", "target": "t"}\n[1, 2]\n')
    with pytest.raises(ValueError, match="line 2 is a JSON list, not an object"):
        read_pairs(str(tmp_path / "b.jsonl"), "source", "target")
    (tmp_path / "c.jsonl").write_text('{"source": "s", "target": "t"}\n{"source": "s"\n')
    with pytest.raises(ValueError, match="c.jsonl line 2 is not JSON"):
        read_pairs(str(tmp_path / "c.jsonl"), "source", "target")
    with pytest.raises(ValueError, match="is not .jsonl, .json, .csv"):
        pick_columns(str(tmp_path / "a.xlsx"), None, None)


def test_build_splits_text_pairs_is_real_and_keeps_the_tokenizer():
    s = build_splits(
        {"text_pairs": {"train": "train.jsonl", "eval": "eval.jsonl"}},
        task="seq2seq",
        seq_len=48,
        vocab=264,
        seed=0,
        base_dir=PAIRS,
        target_len=40,
    )
    assert s.real and isinstance(s.tokenizer, ByteTokenizer)
    assert s.train["labels"].shape == (40, 40) and s.eval["input_ids"].shape == (8, 48)
    assert "text pairs (bytes tokens), 40 train / 8 eval rows" in s.description
    syn = build_splits(
        {"synthetic": {"train_samples": 4, "eval_samples": 2}},
        task="seq2seq",
        seq_len=8,
        vocab=64,
        seed=0,
        base_dir=".",
        target_len=4,
    )
    assert not syn.real and syn.tokenizer is None  # no text to read back: no BLEU


def test_bleu_statistics_add_up_to_sacrebleus_corpus_bleu():
    hyps = ["the cat sat on the mat", "hello there", "a b c d e f", ""]
    refs = ["the cat sat on a mat", "hello there friend", "a b c x e f", "nothing"]
    parts = [
        metrics.bleu_stats(hyps[:1], refs[:1]),
        metrics.bleu_stats(hyps[1:3], refs[1:3]),
        metrics.bleu_stats(hyps[3:], refs[3:]),
        metrics.bleu_stats([], []),
    ]
    total = [sum(x) for x in zip(*parts)]
    assert metrics.bleu(total) == pytest.approx(corpus_bleu(hyps, [refs]).score, abs=1e-9)
    assert metrics.bleu(metrics.bleu_stats(refs[:3], refs[:3])) == pytest.approx(100.0)


def _scripted_forward(replies: list[str], vocab: int = 264):
    """A stand-in model whose greedy output is `replies` (bytes), then the end token."""
    tok = ByteTokenizer()
    scripts = [tok.encode(r) + [tok.sep_id] for r in replies]

    def forward(batch):
        dec = batch["decoder_input_ids"]
        t = dec.shape[1] - 1  # tokens generated so far
        logits = torch.zeros(dec.shape[0], dec.shape[1], vocab)
        for i, s in enumerate(scripts):
            logits[i, -1, s[min(t, len(s) - 1)]] = 1.0
        return SimpleNamespace(logits=logits)

    return forward


def test_bleu_of_known_generations_equals_sacrebleu():
    pairs = [
        ("How are you?", "I am fine, thanks."),
        ("Where is it?", "It is by the park."),
        ("Lunch?", "A sandwich and an apple."),
        ("Padding row", "never counted"),
    ]
    replies = ["I am fine, thank you.", "It is near the park.", "A sandwich and an apple.", "xyz"]
    config = SimpleNamespace(pad_token_id=0, eos_token_id=2, bos_token_id=1, decoder_start_token_id=1)
    gen = TextGeneration(_scripted_forward(replies), ByteTokenizer(), config, max_len=40)
    batch = encode(pairs, ByteTokenizer(), 24, 40)
    valid = torch.tensor([True, True, True, False])
    hyps, refs = gen.texts(batch, valid)
    assert hyps == replies[:3] and refs == [t for _, t in pairs[:3]]
    sums = EvalSums("seq2seq", torch.device("cpu"), bleu=True)
    sums.add(torch.zeros(4, 40, 264), batch["labels"], valid)
    sums.add_texts(hyps[:2], refs[:2])  # two micro-batches add up
    sums.add_texts(hyps[2:], refs[2:])
    out = sums.result()
    assert out["bleu"] == pytest.approx(corpus_bleu(replies[:3], [refs]).score, abs=1e-9)
    assert 0 < out["bleu"] < 100 and "loss" in out
    cut = TextGeneration(_scripted_forward(replies), ByteTokenizer(), config, max_len=5).texts(batch, valid)[0]
    assert cut == [r[:5] for r in replies[:3]]  # at most max_len tokens


@needs_transformers
def test_greedy_generation_equals_transformers_generate_and_bleu_matches():
    from zbench.models.configs import load_arch
    from zbench.models.factory import build_model

    torch.manual_seed(0)
    bundle = build_model(
        task="seq2seq", arch=load_arch("tiny-blenderbot", os.path.join(REPO, "scenarios"), {}), pretrained=None
    )
    s = build_splits(
        {"text_pairs": {"train": "train.jsonl", "eval": "eval.jsonl"}},
        task="seq2seq",
        seq_len=48,
        vocab=bundle.vocab,
        seed=0,
        base_dir=PAIRS,
        target_len=24,
    )
    model = bundle.model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(30):  # a little training, so the replies are not one repeated byte
        idx = torch.arange(8) + 8 * (step % 5)
        bundle.call(model, {k: v[idx] for k, v in s.train.items()}).loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    ids, mask = s.eval["input_ids"], s.eval["attention_mask"]
    ours = greedy_generate(lambda b: bundle.call(model, b), ids, mask, max_len=24, start_id=1, eos_id=2, pad_id=0)
    theirs = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=24,
        do_sample=False,
        num_beams=1,
        no_repeat_ngram_size=0,
        encoder_no_repeat_ngram_size=0,
        forced_eos_token_id=None,
        repetition_penalty=1.0,
        min_length=0,
    )
    assert torch.equal(ours, theirs[:, 1:])  # the start token left out
    gen = TextGeneration(lambda b: bundle.call(model, b), s.tokenizer, model.config, max_len=24)
    hyps, refs = gen.texts(s.eval, torch.ones(8, dtype=torch.bool))
    tok = s.tokenizer
    assert hyps == [tok.decode(g[: g.index(2)] if 2 in g else g) for g in theirs[:, 1:].tolist()]
    sums = EvalSums("seq2seq", torch.device("cpu"), bleu=True)
    sums.add_texts(hyps, refs)
    assert sums.result()["bleu"] == pytest.approx(corpus_bleu(hyps, [refs]).score, abs=1e-9)


def test_synthetic_seq2seq_table_has_no_bleu_column_and_says_why():
    summary = {
        "task": "seq2seq",
        "data_kind": "synthetic",
        "scenario": "s",
        "init": "random-init",
        "model": "m",
        "data_desc": "synthetic",
        "precision": "fp32",
        "world_size": 2,
        "device": "cpu",
        "parity_tol": 1e-3,
        "variants": [],
    }
    text = markdown(summary)
    assert "BLEU |" not in text.splitlines()[0] and "| Eval loss |" in text.splitlines()[0]
    assert "no BLEU: it needs real text pairs (data.text_pairs)" in text
    text = markdown({**summary, "data_kind": "real"})
    assert "| BLEU | Eval loss |" in text.splitlines()[0] and "sacrebleu corpus BLEU of greedy outputs" in text


@needs_transformers
def test_pair_file_problems_are_one_line_before_launch(tmp_path):
    import yaml

    (tmp_path / "qa.jsonl").write_text('{"question": "q", "answer": "a"}\n')
    with open(os.path.join(REPO, "scenarios", "seq2seq_tiny.yaml")) as f:
        base = yaml.safe_load(f)
    base["model"]["arch"] = os.path.join(REPO, "zbench", "model_configs", "tiny-blenderbot.json")
    for data, expected in [
        ({"text_pairs": {"train": "nope.jsonl"}}, "data.text_pairs: nope.jsonl does not exist"),
        ({"text_pairs": {"train": "qa.jsonl"}}, "qa.jsonl has columns question, answer; name the text columns"),
        (
            {"text_pairs": {"train": "qa.jsonl", "source_column": "question", "target_column": "reply"}},
            "column 'reply' is not in it",
        ),
        (
            {"synthetic": {}, "metric": "bleu"},
            "metric 'bleu' needs real text pairs (data.text_pairs), not data.synthetic",
        ),
    ]:
        metric = data.pop("metric", None)
        path = write_scenario(tmp_path, {**base, "data": data, **({"metric": metric} if metric else {})})
        assert expected in refused_run(tmp_path, path)


@needs_transformers
def test_seq2seq_run_reports_bleu_on_two_ranks(tmp_path):
    proc = zbench(
        "run", "scenarios/seq2seq_tiny.yaml", "--variants", "ddp,zero3", "--out", str(tmp_path), "--wandb", "off"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = table(proc.stdout)
    assert set(rows) == {"ddp", "zero3"}
    for row in rows.values():
        assert row["Data"] == "real" and 0.0 <= float(row["BLEU"]) <= 100.0 and float(row["Eval loss"]) > 0
    assert rows["zero3"]["Loss parity vs DDP"].endswith(" ok")
    with open(os.path.join(run_dir(proc.stdout), "results.json")) as f:
        summary = json.load(f)
    bleus = [v["eval"]["bleu"] for v in summary["variants"]]
    assert bleus[0] > 0  # 80 steps teach the toy model a few words of the replies
    assert bleus[1] == pytest.approx(bleus[0], abs=0.5)  # zero3 gathers its weights in every generation step
    assert "text pairs (bytes tokens), 40 train / 8 eval rows" in printed(proc.stdout)
