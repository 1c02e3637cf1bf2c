"""Data: the MRPC TSV loader on the fixture (both layouts), text blocks, synthetic splits, per-rank batches."""

from __future__ import annotations

import pytest
import torch

from helpers import FIXTURES
from zbench.data import build_splits
from zbench.data.batches import eval_batches, steps_per_epoch, train_stream
from zbench.data.mrpc import find_mrpc_files, load_mrpc, read_pairs
from zbench.data.synthetic import synthetic_split
from zbench.data.tokenize import ByteTokenizer, pair_ids

FIXTURE = str(FIXTURES / "mrpc_tiny")


def test_mrpc_fixture_reads_glue_layout():
    train, dev = find_mrpc_files(FIXTURE)
    assert train.endswith("train.tsv") and dev.endswith("dev.tsv")
    pairs = read_pairs(train)
    assert len(pairs) == 32 and len(read_pairs(dev)) == 8
    assert pairs[0].label == 1 and pairs[0].a.startswith("The harbour ferry")
    assert pairs[1].label == 0 and pairs[1].b.endswith("in March.")
    assert sum(p.label for p in pairs) == 20  # paraphrase-heavy, like MRPC (about two thirds positive)


def test_mrpc_original_release_layout(tmp_path):
    header = "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"  # the release starts with a BOM
    (tmp_path / "msr_paraphrase_train.txt").write_text(header + '1\t1\t2\tHe said "yes".\tHe answered "yes".\n')
    (tmp_path / "msr_paraphrase_test.txt").write_text(header + "0\t3\t4\tA cat.\tA dog.\n")
    train, dev = load_mrpc(str(tmp_path), ByteTokenizer(), 24)
    assert train["labels"].tolist() == [1] and dev["labels"].tolist() == [0]
    ids = train["input_ids"][0].tolist()
    assert ids[0] == ByteTokenizer.cls_id and bytes(i - 3 for i in ids[1:11]) == b'He said "y'  # quotes kept


def test_mrpc_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="is not a folder"):
        find_mrpc_files(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="neither train.tsv"):
        find_mrpc_files(str(tmp_path))
    (tmp_path / "train.tsv").write_text("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\nyes\t1\t2\ta\tb\n")
    (tmp_path / "dev.tsv").write_text("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n")
    with pytest.raises(ValueError, match="line 2"):
        read_pairs(str(tmp_path / "train.tsv"))


def test_pair_encoding_truncates_the_longer_sentence_and_pads():
    tok = ByteTokenizer()
    ids, mask = pair_ids(tok, "a" * 20, "bb", 12)
    assert len(ids) == len(mask) == 12 and sum(mask) == 12
    assert ids.count(tok.sep_id) == 2 and ids[-1] == tok.sep_id and ids[-3:-1] == [ord("b") + 3] * 2
    ids, mask = pair_ids(tok, "a", "b", 8)
    assert ids[5:] == [tok.pad_id] * 3 and mask == [1] * 5 + [0] * 3


def test_build_splits_mrpc_is_real():
    s = build_splits({"mrpc_tsv": FIXTURE}, task="classification", seq_len=64, vocab=512, seed=0, base_dir=".")
    assert s.real and s.train["input_ids"].shape == (32, 64) and s.eval["labels"].shape == (8,)
    assert "32 train / 8 eval" in s.description


def test_text_files_become_blocks(tmp_path):
    (tmp_path / "a.txt").write_text("hello world " * 40)
    s = build_splits({"text_files": ["a.txt"], "eval_fraction": 0.25}, task="lm", seq_len=15, vocab=512, seed=0,
                     base_dir=str(tmp_path))
    n_train, n_eval = s.train["input_ids"].shape[0], s.eval["input_ids"].shape[0]
    assert s.real and n_eval == round((n_train + n_eval) * 0.25) and s.train["input_ids"].shape[1] == 15
    assert torch.equal(s.train["input_ids"][0, 1:], s.train["labels"][0, :-1])  # labels are the next tokens


def test_synthetic_splits_are_deterministic_and_labelled():
    for task in ("lm", "classification", "token_classification", "seq2seq"):
        a = synthetic_split(task, 16, 8, 100, seed=3, num_labels=3, target_len=4)
        b = synthetic_split(task, 16, 8, 100, seed=3, num_labels=3, target_len=4)
        assert all(torch.equal(a[k], b[k]) for k in a)
        assert int(a["input_ids"].max()) < 100
    assert synthetic_split("seq2seq", 4, 8, 100, 0, target_len=4)["labels"].shape == (4, 4)
    assert set(synthetic_split("classification", 64, 8, 100, 0)["labels"].tolist()) == {0, 1}


def test_ranks_get_disjoint_slices_of_the_same_global_batches():
    split = {"input_ids": torch.arange(40).view(20, 2)}
    per_rank = [train_stream(split, batch=3, rank=r, world=2, seed=1) for r in range(2)]
    rows = [[int(x) // 2 for x in next(s)["input_ids"][:, 0]] for s in per_rank]
    assert not set(rows[0]) & set(rows[1])
    again = train_stream(split, batch=3, rank=0, world=2, seed=1)
    assert [int(x) // 2 for x in next(again)["input_ids"][:, 0]] == rows[0]  # same seed, same order
    big = next(train_stream(split, batch=16, rank=1, world=2, seed=1))  # larger than the split: spans passes
    assert big["input_ids"].shape == (16, 2)
    assert steps_per_epoch(split, 3, 2) == 3


def test_eval_batches_pad_evenly_and_mask():
    split = {"x": torch.arange(5)}
    seen = []
    counts = []
    for rank in range(2):
        batches = list(eval_batches(split, batch=2, rank=rank, world=2))
        counts.append(len(batches))
        seen += [int(v) for b, valid in batches for v, ok in zip(b["x"], valid) if ok]
    assert counts == [2, 2] and sorted(seen) == [0, 1, 2, 3, 4]
