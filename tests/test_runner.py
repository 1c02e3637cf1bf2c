"""`zbench run` end to end on CPU ranks: the quickstart table, W&B offline runs read back with wandb's own
reader, `zbench report`, `--resume`, a simulated two-node run and MRPC (failures: test_runner_faults.py).

Every command runs in a fresh subprocess: `zbench run` forks its CPU ranks, which is only safe from a
process that has run no torch op (see zbench/launch.py), and the pytest process has.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

from helpers import REPO, printed, run_dir, table, zbench

pytestmark = pytest.mark.slow  # spawned ranks or whole runs: outside the fast tier (-m 'not slow')


@pytest.fixture(scope="module")
def quickstart_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    proc = zbench("run", "scenarios/quickstart.yaml", "--out", str(out), env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, run_dir(proc.stdout)


def test_the_printed_table_fits_the_terminal(quickstart_run):
    """Printed in an 80-column terminal: no line over 120 characters, every row there with its numbers; the
    columns equal in every row are named once in the caption, and table.md keeps every column."""
    proc, folder = quickstart_run
    lines = proc.stdout.splitlines()[1:]  # after the run folder's path, which is as long as it is
    assert max(len(line) for line in lines) <= 120
    rows = table(proc.stdout)  # table.md
    start = next(i for i, line in enumerate(lines) if line.startswith("Variant"))
    shown = {line.split()[0]: line for line in lines[start:] if line.split() and line.split()[0] in rows}
    assert list(shown) == list(rows)
    for name, row in rows.items():
        assert row["Tokens/s"] in shown[name] and row["Loss parity vs DDP"] in shown[name]
    text = printed("\n".join(lines))
    assert "In every row: Model: random-init tiny-gpt; Data: synthetic; Batch size (max): 8 (set)" in text
    assert "Model" not in lines[start] and len(next(iter(rows.values()))) > len(lines[start].split())


def test_quickstart_prints_the_table_last(quickstart_run):
    proc, folder = quickstart_run
    rows = table(proc.stdout)
    assert list(rows) == ["ddp", "zero1", "zero2", "zero3", "fsdp2"]
    for name, row in rows.items():
        assert row["Model"] == "random-init tiny-gpt" and row["Data"] == "synthetic"
        assert row["Batch size (max)"] == "8 (set)"
        parity = row["Loss parity vs DDP"]
        assert parity.endswith("reference" if name == "ddp" else " ok"), parity
        assert float(row["Eval loss"]) < 5.0  # learned something from ln(512) = 6.24
    body = proc.stdout.rstrip().splitlines()
    caption = " ".join(
        " ".join(body[next(i for i, line in enumerate(body) if line.startswith("quickstart: ")) :]).split()
    )
    assert caption.startswith("quickstart: random-init tiny-gpt, synthetic data")  # the table's caption ends it
    summary = json.load(open(os.path.join(folder, "results.json")))
    for v in summary["variants"]:  # timing_skip_steps: 2 -> tokens/s over the 14 later steps of epoch 1
        assert v["steady"] and v["tokens_per_s"] == pytest.approx(8 * 2 * 32 / (v["step_ms"] / 1e3))
        assert rows[v["variant"]]["Step (ms)"] == f"{v['step_ms']:.1f}"
    assert "leave out the first 2 optimizer steps" in caption
    floor = summary["floor"]  # measured on one rank before the variants
    assert floor["fwd_bwd_ms"] > 0 and floor["optimizer_ms"] > 0 and floor["batch"] == 8
    assert floor["shard_numel"] == -(-summary["variants"][0]["n_params"] // 2)
    for v in summary["variants"]:
        assert v["vs_floor"] == pytest.approx(v["step_ms"] / (floor["fwd_bwd_ms"] + floor["optimizer_ms"]))
        assert rows[v["variant"]]["Step vs floor"] == f"{v['vs_floor']:.3f}x"
    assert "floor: forward+backward alone" in caption
    ref = summary["variants"][0]["losses"]
    assert len(ref) == 32 and ref[-1] < ref[0] - 1.0
    for v in summary["variants"][1:]:
        assert v["parity"] <= 1e-3 and max(abs(a - b) for a, b in zip(v["losses"], ref)) == v["parity"]
    for name in ("results.csv", "table.md", "throughput.png", "memory.png", "loss.png", "scenario.yaml"):
        assert os.path.getsize(os.path.join(folder, name)) > 0
    assert glob.glob(os.path.join(folder, "logs", "zero3", "zero3-train*", "attempt_0", "1", "stdout.log"))
    from zbench.run_summary import load_kept, load_summary

    assert load_summary(folder) == summary  # what report and estimate --run accept: a real run's files
    for v in summary["variants"]:
        load_kept(folder, os.path.join(folder, "variants", f"{v['variant']}.json"), "row")
    load_kept(folder, os.path.join(folder, "floor.json"), "floor")


def test_wandb_offline_runs_read_back_with_wandbs_reader(quickstart_run):
    _, folder = quickstart_run
    summary = json.load(open(os.path.join(folder, "results.json")))
    runs = sorted(glob.glob(os.path.join(folder, "wandb", "offline-run-*")))
    assert len(runs) == 6  # one per variant + the summary table
    seen = {}
    for path in runs:
        proc = subprocess.run(["wandb", "leet", "inspect", "--json", path], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        records = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
        run = next(r["run"] for r in records if r["type"] == "run")
        assert run["run_group"] == "quickstart"
        history = [r["history"]["item"] for r in records if r["type"] == "history"]
        seen[run["display_name"].split("@")[0]] = history
    assert set(seen) == {"ddp", "zero1", "zero2", "zero3", "fsdp2", "summary"}
    for v in summary["variants"]:  # logged live by rank 0: one row per optimizer step while it trained
        history = seen[v["variant"]]
        assert [h["train/global_step"] for h in history] == list(range(1, len(v["losses"]) + 1))  # gas 1
        for h in history:
            assert h["train/learning_rate"] == pytest.approx(3e-3) and h["train/grad_norm"] > 0
            assert h["train/tokens_per_second"] > 0 and h["train/cpu_rss_gib"] > 0 and h["train/skipped_steps"] == 0
        assert history[0]["train/loss"] > history[-1]["train/loss"] + 1.0
        started, ended = v["train_wall"]  # the worker's wall clock around its training and eval
        assert started < history[0]["_timestamp"] < ended  # step 1 was written during training, not replayed after
        assert history[0]["_timestamp"] < history[len(history) // 2]["_timestamp"] < history[-1]["_timestamp"]
        assert history[-1]["eval/loss"] == pytest.approx(v["eval"]["loss"])
    assert seen["summary"][0]["results.nrows"] == 5 and seen["summary"][0]["results._type"] == "table-file"


def test_report_rewrites_the_files_and_resume_keeps_finished_variants(quickstart_run, tmp_path):
    proc, folder = quickstart_run
    copy = str(tmp_path / "run")
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("wandb"))
    for name in ("table.md", "results.csv", "throughput.png", "memory.png", "loss.png"):
        os.remove(os.path.join(copy, name))
    rep = zbench("report", copy, env={"COLUMNS": "80"})
    assert rep.returncode == 0, rep.stderr
    assert table(rep.stdout) == table(proc.stdout)
    assert rep.stdout.splitlines()[3:] == proc.stdout.splitlines()[3:]  # the same terminal table
    for name in ("results.csv", "throughput.png", "memory.png", "loss.png"):
        assert os.path.getsize(os.path.join(copy, name)) > 0
    again = zbench("run", "scenarios/quickstart.yaml", "--resume", copy, "--wandb", "off")
    assert again.returncode == 0, again.stderr
    assert "kept from" in again.stderr and "training" not in again.stderr  # nothing relaunched
    assert table(again.stdout) == table(proc.stdout)


def _free_port_run(n: int) -> int:
    """A base port with n free consecutive ports after it (one rendezvous per launch)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n >= 65535:
            continue
        try:
            socks = []
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range")


def test_two_nodes_simulated_on_one_machine_give_the_same_table(quickstart_run, tmp_path):
    """Two launcher processes (--nnodes 2 --node-rank 0|1, one rank each, localhost rendezvous) run the
    quickstart: node 0 prints the table of the single-node run. About 30 s on 2 cores."""
    _, folder = quickstart_run
    port = _free_port_run(5)
    common = [
        "run",
        "scenarios/quickstart.yaml",
        "--gpus",
        "1",
        "--nnodes",
        "2",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--out",
        str(tmp_path),
        "--wandb",
        "off",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_SILENT": "true"}  # two "nodes" share two cores
    node1 = subprocess.Popen(
        [sys.executable, "-m", "zbench", *common, "--node-rank", "1"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    node0 = zbench(*common, "--node-rank", "0", env={"OMP_NUM_THREADS": "1"})
    out1, err1 = node1.communicate(timeout=300)
    assert node0.returncode == 0, node0.stderr[-3000:]
    assert node1.returncode == 0, err1[-3000:]
    assert "node 1: all launches finished" in out1
    single = json.load(open(os.path.join(folder, "results.json")))
    multi = json.load(open(os.path.join(run_dir(node0.stdout), "results.json")))
    assert multi["nodes"] == 2 and multi["world_size"] == single["world_size"] == 2
    for a, b in zip(single["variants"], multi["variants"]):
        assert (a["variant"], a["status"], a["batch"], a["parity_note"]) == (
            b["variant"],
            b["status"],
            b["batch"],
            b["parity_note"],
        )
        assert b["losses"] == pytest.approx(a["losses"], abs=1e-5)
        assert b["eval"]["loss"] == pytest.approx(a["eval"]["loss"], abs=1e-5)
    rows1, rows2 = table(node0.stdout), table(zbench("report", folder).stdout)
    keep = ("Variant", "Method", "Model", "Data", "Batch size (max)", "Eval loss", "Perplexity")
    assert {k: [r[c] for c in keep] for k, r in rows1.items()} == {k: [r[c] for c in keep] for k, r in rows2.items()}


def test_mrpc_classification_reports_f1_on_real_data(tmp_path):
    proc = zbench("run", "scenarios/mrpc_tiny.yaml", "--out", str(tmp_path), "--wandb", "off")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = table(proc.stdout)
    assert set(rows) == {"ddp", "zero2"}
    for row in rows.values():
        assert row["Data"] == "real" and 0.0 <= float(row["F1"]) <= 1.0 and 0.0 <= float(row["Accuracy"]) <= 1.0
    assert rows["zero2"]["Method"] == "zero_core ZeRO Stage 2"
    assert rows["zero2"]["Loss parity vs DDP"].endswith(" ok")
    assert "MRPC (bytes tokens), 32 train / 8 eval rows" in printed(proc.stdout)


@pytest.mark.parametrize(
    "resource, exitcode, note",
    [
        ("memory", 1, "OOM Error at batch 8"),
        ("memory", -9, "OOM Error at batch 8 (rank 1 was SIGKILLed: most often the out-of-memory killer)"),
        ("disk space", 1, "Out of disk space at batch 8"),
    ],
)
def test_a_batch_that_did_not_train_is_named_by_what_ran_out(resource, exitcode, note):
    from zbench.launch import OutOfDisk, OutOfMemory, shortfall, untrained_note

    cause = "ValueError: nvme_path '/x' has 1 bytes free but optimizer states need 8 bytes"
    failure = (OutOfMemory if resource == "memory" else OutOfDisk)("x", rank=1, exitcode=exitcode, cause=cause)
    assert failure.resource == resource and untrained_note(failure, 8) == note
    assert untrained_note(None, 8) == "OOM Error at batch 8"  # kept from the run resumed: no failure to read
    said = "out of memory" if resource == "memory" else f"out of disk space ({cause.removeprefix('ValueError: ')})"
    assert shortfall(failure) == said
