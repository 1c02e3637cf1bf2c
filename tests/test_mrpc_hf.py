"""MRPC from Hugging Face `datasets` files, read with pyarrow: every on-disk layout gives the TSV reader's pairs.

The files are written here with pyarrow in the layouts `datasets` and the Hub use (Arrow IPC streams in
the datasets cache and in save_to_disk folders, Parquet in Hub snapshots), from the committed TSV fixture.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

pa = pytest.importorskip("pyarrow", reason="MRPC from datasets files needs pyarrow (pip install -e '.[test]')")
import pyarrow.parquet as pq  # noqa: E402 (after the importorskip)

from helpers import FIXTURES, TINY, refused_run, write_scenario  # noqa: E402 (after the importorskip)
from zbench.data import build_splits  # noqa: E402 (after the importorskip)
from zbench.data.mrpc import find_mrpc_files, load_mrpc, read_pairs  # noqa: E402 (after the importorskip)
from zbench.data.mrpc_hf import find_mrpc_hf, load_mrpc_hf  # noqa: E402 (after the importorskip)
from zbench.data.tokenize import ByteTokenizer  # noqa: E402 (after the importorskip)

FIXTURE = str(FIXTURES / "mrpc_tiny")
HASH = "dacbe3125aa31d7f70367a07a8a9e72a5a0bfeb5fc42e75c9db75b96da6053ad"


def glue_table(split: str) -> pa.Table:
    """The split as datasets stores GLUE MRPC: sentence1, sentence2, label (class id), idx."""
    train, dev = find_mrpc_files(FIXTURE)
    if split == "test":  # GLUE's test split is unlabelled: label -1
        pairs = read_pairs(dev)
        labels = [-1] * len(pairs)
    else:
        pairs = read_pairs(train if split == "train" else dev)
        labels = [p.label for p in pairs]
    return pa.table(
        {
            "sentence1": [p.a for p in pairs],
            "sentence2": [p.b for p in pairs],
            "label": pa.array(labels, pa.int64()),
            "idx": pa.array(range(len(pairs)), pa.int32()),
        }
    )


def write_stream(path, table: pa.Table, chunk: int | None = None) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=chunk):
            writer.write_batch(batch)


def builder_cache(folder, shards: int = 1) -> None:
    """`load_dataset`'s cache folder: glue-<split>.arrow, or glue-<split>-0000i-of-0000n.arrow shards."""
    for split in ("train", "validation", "test"):
        table = glue_table(split)
        if shards == 1 or split != "train":
            write_stream(os.path.join(folder, f"glue-{split}.arrow"), table)
            continue
        step = -(-table.num_rows // shards)
        for i in range(shards):
            write_stream(
                os.path.join(folder, f"glue-{split}-{i:05d}-of-{shards:05d}.arrow"), table.slice(i * step, step)
            )
    with open(os.path.join(folder, "dataset_info.json"), "w") as f:
        json.dump({"builder_name": "glue", "config_name": "mrpc"}, f)
    open(os.path.join(folder, "LICENSE"), "w").close()


def hub_snapshot(folder) -> None:
    """The Hub's Parquet: <snapshot>/mrpc/<split>-00000-of-00001.parquet."""
    os.makedirs(folder, exist_ok=True)
    for split in ("train", "validation", "test"):
        pq.write_table(glue_table(split), os.path.join(folder, f"{split}-00000-of-00001.parquet"))


def saved_dict(folder, with_dict_json: bool = True) -> None:
    """DatasetDict.save_to_disk: dataset_dict.json + <split>/data-00000-of-00001.arrow + state.json."""
    for split in ("train", "validation", "test"):
        sub = os.path.join(folder, split)
        write_stream(os.path.join(sub, "data-00000-of-00001.arrow"), glue_table(split), chunk=5)
        with open(os.path.join(sub, "state.json"), "w") as f:
            json.dump(
                {
                    "_data_files": [{"filename": "data-00000-of-00001.arrow"}],
                    "_fingerprint": "0" * 16,
                    "_format_columns": None,
                    "_format_kwargs": {},
                    "_format_type": None,
                    "_output_all_columns": False,
                    "_split": split,
                },
                f,
            )
        with open(os.path.join(sub, "dataset_info.json"), "w") as f:
            json.dump({"builder_name": "glue", "config_name": "mrpc"}, f)
    if with_dict_json:
        with open(os.path.join(folder, "dataset_dict.json"), "w") as f:
            json.dump({"splits": ["train", "validation", "test"]}, f)


def assert_same_as_tsv(where: str) -> None:
    tok = ByteTokenizer()
    want = load_mrpc(FIXTURE, tok, 64)
    got = load_mrpc_hf(where, tok, 64)
    for w, g in zip(want, got):
        assert w.keys() == g.keys() and all(torch.equal(w[k], g[k]) for k in w)


@pytest.mark.parametrize(
    "layout,point_at",
    [
        ("glue/mrpc/1.0.0/HASH", "glue/mrpc/1.0.0/HASH"),  # the hash folder itself
        ("glue/mrpc/1.0.0/HASH", "glue/mrpc"),  # datasets < 2.14, a script build
        ("glue/mrpc/1.0.0/HASH", "glue"),
        ("glue/mrpc/1.0.0/HASH", ""),  # the datasets cache root
        ("nyu-mll___glue/mrpc/0.0.0/HASH", ""),  # newer datasets: built from the Hub's Parquet
        ("hub/datasets--nyu-mll--glue/snapshots/REV/mrpc", "hub"),  # the Hub cache's Parquet
        ("hub/datasets--nyu-mll--glue/snapshots/REV/mrpc", "hub/datasets--nyu-mll--glue"),
        ("hub/datasets--nyu-mll--glue/snapshots/REV/mrpc", ""),  # ~/.cache/huggingface
        ("saved", "saved"),  # DatasetDict.save_to_disk
    ],
)
def test_every_layout_reads_the_tsv_pairs(tmp_path, layout, point_at):
    folder = os.path.join(tmp_path, layout.replace("HASH", HASH).replace("REV", "1b2c3d"))
    if layout.startswith("hub"):
        hub_snapshot(folder)
    elif layout == "saved":
        saved_dict(folder)
    else:
        builder_cache(folder)
    assert_same_as_tsv(os.path.join(tmp_path, point_at.replace("HASH", HASH)))


def test_sharded_cache_and_split_folders_without_dataset_dict_json(tmp_path):
    builder_cache(tmp_path / "nyu-mll___glue" / "mrpc" / "0.0.0" / HASH, shards=3)
    files = find_mrpc_hf(str(tmp_path))
    assert [os.path.basename(f) for f in files.train] == [f"glue-train-0000{i}-of-00003.arrow" for i in range(3)]
    assert_same_as_tsv(str(tmp_path))
    saved_dict(tmp_path / "two", with_dict_json=False)  # train/ and validation/ each from Dataset.save_to_disk
    assert_same_as_tsv(str(tmp_path / "two"))


def test_newest_hash_folder_wins_and_cache_keyword_reads_the_env(tmp_path, monkeypatch):
    old = tmp_path / "datasets" / "glue" / "mrpc" / "1.0.0" / "0ld"
    builder_cache(old)
    write_stream(old / "glue-validation.arrow", glue_table("validation").slice(0, 3))  # differs from the TSV
    os.utime(old, (1_000_000, 1_000_000))
    builder_cache(tmp_path / "datasets" / "glue" / "mrpc" / "1.0.0" / HASH)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "no-hub"))
    assert find_mrpc_hf("cache").folder.endswith(HASH)
    assert_same_as_tsv("cache")
    s = build_splits({"mrpc_hf": "cache"}, task="classification", seq_len=64, vocab=512, seed=0, base_dir="/nowhere")
    assert s.real and "MRPC from datasets files" in s.description and "32 train / 8 eval" in s.description


def test_hf_home_finds_the_hub_parquet(tmp_path, monkeypatch):
    for var in ("HF_DATASETS_CACHE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    hub_snapshot(tmp_path / "hub" / "datasets--nyu-mll--glue" / "snapshots" / "abc" / "mrpc")
    assert_same_as_tsv("cache")


def test_errors_are_one_line_and_say_where_they_looked(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="missing is not a folder"):
        find_mrpc_hf(str(tmp_path / "missing"))
    with pytest.raises(ValueError) as e:
        find_mrpc_hf(str(tmp_path))
    msg = str(e.value)
    assert "\n" not in msg and f"no MRPC train + validation split files under {tmp_path}" in msg
    assert "glue-train.arrow" in msg and "nyu-mll___glue/mrpc" in msg and "dataset_dict.json" in msg
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "d"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "h"))
    with pytest.raises(ValueError, match=f"under {tmp_path / 'd'} or {tmp_path / 'h'}"):
        find_mrpc_hf("cache")
    qnli = tmp_path / "qnli"  # another GLUE task's columns
    for split in ("train", "validation"):
        write_stream(qnli / f"glue-{split}.arrow", pa.table({"question": ["q"], "sentence": ["s"], "label": [0]}))
    with pytest.raises(
        ValueError, match="has columns question, sentence, label; MRPC needs sentence1, sentence2, label"
    ):
        find_mrpc_hf(str(qnli))
    unlabelled = tmp_path / "unlabelled"
    write_stream(unlabelled / "glue-train.arrow", glue_table("train"))
    write_stream(unlabelled / "glue-validation.arrow", glue_table("test"))
    with pytest.raises(ValueError, match="label -1; MRPC labels are 0 or 1"):
        load_mrpc_hf(str(unlabelled), ByteTokenizer(), 32)
    (unlabelled / "glue-validation.arrow").write_bytes(b"not arrow")
    with pytest.raises(ValueError, match="is not a readable Arrow or Parquet file"):
        find_mrpc_hf(str(unlabelled))


def test_scenarios_check_the_data_before_launching(tmp_path):
    """`zbench run` names the data problem in one line and launches nothing."""
    from zbench.plan import build_plan

    saved_dict(tmp_path / "mrpc")
    (tmp_path / "a.jsonl").write_text('{"source": "s", "target": "t"}\n')
    base = {
        "model": {"arch": TINY, "num_labels": 2},
        "data": {"mrpc_hf": "mrpc"},
        "task": "classification",
        "seq_len": 64,
        "steps": 1,
        "batch_size": 2,
        "gpus": 2,
        "variants": [{"name": "ddp", "engine": "ddp"}],
    }
    path = write_scenario(tmp_path, base)
    assert build_plan(path).scenario.data.kind == "mrpc_hf"  # relative to the scenario file
    for data, task, expected in [
        ({"mrpc_hf": "empty"}, "classification", "data.mrpc_hf: no MRPC train + validation split files under"),
        ({"mrpc_hf": "mrpc"}, "lm", "data.mrpc_hf is a sentence-pair classification set; set task: classification"),
        ({"mrpc_tsv": "mrpc", "mrpc_hf": "mrpc"}, "classification", "give exactly one data source"),
        ({"text_pairs": {"train": "a.jsonl"}}, "classification", "data.text_pairs holds source/target pairs"),
    ]:
        (tmp_path / "empty").mkdir(exist_ok=True)
        write_scenario(tmp_path, {**base, "data": data, "task": task})
        assert expected in refused_run(tmp_path, path)
