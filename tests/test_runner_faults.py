"""`zbench run` when things go wrong, end to end on CPU ranks: OOM rows and the OOM-safe batch search (resumed
where it stopped), a rank that fails, a run killed and resumed from its checkpoint, NVMe offload's files, and
the eval batch search. Faults are injected into the ranks by tests/run_with_faults.py.
"""

from __future__ import annotations

import glob
import json
import os
import re

import pytest

from helpers import quickstart, run_dir, table, tiny_scenario, write_scenario, zbench

pytestmark = pytest.mark.slow  # spawned ranks or whole runs: outside the fast tier (-m 'not slow')


def _fault_scenario(tmp_path) -> str:
    variants = [
        {"name": "searched", "engine": "ddp"},
        {"name": "too-big", "engine": "zero", "stage": 2, "batch_size": 8},
        {"name": "nvme", "engine": "zero", "stage": 3, "offload_param": "nvme", "nvme_path": ".", "batch_size": 2},
    ]
    return tiny_scenario(
        tmp_path, "faults", variants, samples=64, steps=2, batch_size=None, lr=None, batch_search={"start": 4, "max": 8}
    )


def test_oom_is_a_row_and_the_batch_search_is_oom_safe(tmp_path):
    proc = zbench("run", _fault_scenario(tmp_path), "--out", str(tmp_path), "--wandb", "off", faults="oom")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = table(proc.stdout)
    assert rows["searched"]["Batch size (max)"] == "4"  # 4 fits, 8/6/5 ran out of memory in fresh launches
    assert "batch 8: out of memory" in proc.stderr and "batch 5: out of memory" in proc.stderr
    assert rows["too-big"]["Notes"] == "OOM Error at batch 8" and rows["too-big"]["Tokens/s"] == "–"
    assert rows["nvme"]["Tokens/s"] != "–"  # parameters offloaded to a file under the scenario's folder train


def test_resume_goes_on_with_the_batch_search_where_it_stopped(tmp_path):
    """Probes are kept in the run folder: a resumed search does not launch them again. The resumed run has no
    injected OOM, so a probe launched again would fit batch 8; kept, the search still ends at 4."""
    scenario = _fault_scenario(tmp_path)
    proc = zbench("run", scenario, "--out", str(tmp_path), "--wandb", "off", "--variants", "searched", faults="oom")
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = run_dir(proc.stdout)
    probes = json.load(open(os.path.join(folder, "variants", "searched.probes.json")))
    assert probes["fits"] == {"batch 4": True, "batch 8": False, "batch 6": False, "batch 5": False}
    os.remove(os.path.join(folder, "variants", "searched.json"))  # as if interrupted after the search
    again = zbench("run", scenario, "--resume", folder, "--wandb", "off", "--variants", "searched")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "[searched] batch 8: out of memory (kept from the run resumed)" in again.stderr
    assert table(again.stdout)["searched"]["Batch size (max)"] == "4"


def test_a_searched_batch_that_runs_out_of_memory_in_training_steps_down(tmp_path):
    """A short probe can fit where a whole epoch does not: training steps down from the searched maximum, the row
    says so, and --resume does not train the batches that ran out of memory again."""
    scenario = tiny_scenario(tmp_path, "trainoom", [{"name": "searched", "engine": "ddp"}], samples=64, steps=2,
                             batch_size=None, lr=None, batch_search={"start": 1, "max": 4})
    proc = zbench("run", scenario, "--out", str(tmp_path), "--wandb", "off", faults="train-oom")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[searched] training at batch 4: out of memory\n[searched] training: batch 3 per rank" in proc.stderr
    row = table(proc.stdout)["searched"]
    assert row["Batch size (max)"] == "2" and row["Tokens/s"] != "–"
    assert "batch 4 fit the search's short probe but ran out of memory over the epoch" in row["Notes"]
    folder = run_dir(proc.stdout)
    fits = json.load(open(os.path.join(folder, "variants", "searched.probes.json")))["fits"]
    assert fits["training at batch 4"] is False and fits["training at batch 3"] is False and fits["batch 4"] is True
    os.remove(os.path.join(folder, "variants", "searched.json"))
    again = zbench("run", scenario, "--resume", folder, "--wandb", "off")  # no fault now: kept outcomes decide
    assert again.returncode == 0, again.stderr[-3000:]
    assert "[searched] training at batch 4: out of memory (kept from the run resumed)\n[searched] training: batch 3" \
        in again.stderr
    assert table(again.stdout)["searched"]["Batch size (max)"] == "2"


def test_rank_failure_is_one_error_after_the_ranks_last_lines(tmp_path):
    """A failed rank fails its variant, not the run: the table shows it, the rank's last log lines follow, then
    one Error: line, the last of the output, names the failure, the logs folder and the other failures."""
    proc = zbench("run", _fault_scenario(tmp_path), "--out", str(tmp_path), "--wandb", "off", faults="crash")
    assert proc.returncode == 1
    rows = table(proc.stdout)
    assert rows["searched"]["Notes"] == "failed: RuntimeError: injected failure on rank 1"
    assert rows["too-big"]["Notes"].startswith("failed: ") and rows["nvme"]["Notes"].startswith("failed: ")
    lines = proc.stderr.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("Error: "))
    assert lines[at:] == [lines[-1]], lines[at:]  # the error is exactly one line, and nothing follows it
    error = lines[-1]
    assert error.startswith(
        "Error: variant 'searched' (probe, batch 4) failed on rank 1 (exit code 1): "
        "RuntimeError: injected failure on rank 1; its last log lines are above; all logs in "
    )
    assert error.endswith("/logs (2 more variant(s) failed too)") and run_dir(proc.stdout) in error
    before = "\n".join(lines[:at])
    assert "--- last log lines of rank 1" in before and 'raise RuntimeError("injected failure on rank 1")' in before
    assert sum(line.startswith("Error: ") for line in lines) == 1


def test_killed_run_resumes_from_its_checkpoint_with_the_same_losses(tmp_path):
    """`checkpoint_every` + `--resume`: a variant whose rank died mid-training continues from the last
    zero_core checkpoint and ends with the loss curve of a run that never stopped."""
    path = write_scenario(
        tmp_path,
        quickstart(
            name="ckpt", checkpoint_every=4, epochs=1, variants=[{"name": "zero3", "engine": "zero", "stage": 3}]
        ),
        "ckpt",
    )
    straight = zbench("run", path, "--out", str(tmp_path / "a"), "--wandb", "off", "--no-progress")
    assert straight.returncode == 0, straight.stderr[-3000:]
    killed = zbench(
        "run", path, "--out", str(tmp_path / "b"), "--wandb", "off", "--no-progress", faults="crash-at-step-10"
    )
    assert killed.returncode == 1 and "variant 'zero3' (train, batch 8) failed" in killed.stderr
    folder = run_dir(killed.stdout)
    logs = "".join(
        open(f).read()
        for f in glob.glob(os.path.join(folder, "logs", "zero3", "**", "*"), recursive=True)
        if os.path.isfile(f)
    )
    assert "injected failure on rank 1 at step 10" in logs
    assert open(os.path.join(folder, "checkpoints", "zero3", "latest")).read().strip() == "global_step8"
    resumed = zbench("run", path, "--resume", folder, "--wandb", "off", "--no-progress")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a = json.load(open(os.path.join(run_dir(straight.stdout), "results.json")))["variants"][0]["losses"]
    b = json.load(open(os.path.join(folder, "results.json")))["variants"][0]["losses"]
    assert len(a) == len(b) == 16
    assert b == pytest.approx(a, abs=1e-6)


def test_nvme_offload_variant_runs_and_leaves_no_state_files(tmp_path):
    swap = tmp_path / "swap" / "zero"  # not there yet: the run creates the folder the scenario names
    path = tiny_scenario(
        tmp_path,
        "nvme",
        [
            {"name": "ddp", "engine": "ddp"},
            {"name": "zero2-nvme", "engine": "zero", "stage": 2, "offload_optimizer": "nvme", "nvme_path": str(swap)},
        ],
        samples=64,
        steps=4,
    )
    proc = zbench("run", path, "--out", str(tmp_path / "runs"), "--wandb", "off")
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = table(proc.stdout)["zero2-nvme"]
    assert row["Method"] == "zero_core ZeRO Stage 2 + NVMe offload (optimizer)"
    assert row["Loss parity vs DDP"].endswith(" ok"), row
    assert swap.is_dir()
    assert list(swap.rglob("*")) == [] or all(p.is_dir() for p in swap.rglob("*"))  # state files are unlinked
    from zero_core import memory_estimate as estimate

    rows = {r["variant"]: r for r in json.load(open(os.path.join(run_dir(proc.stdout), "results.json")))["variants"]}
    offloaded = rows["zero2-nvme"]
    # measured/estimated compares against the offload row of the estimate (states off the GPU), not the plain one
    assert offloaded["est_gpu_gib"] == pytest.approx(
        estimate.model_states_gib(2, offloaded["n_params"], 0, 2, 1, offload_optimizer=True)
    )  # stage 2 needs no largest layer
    assert offloaded["est_gpu_gib"] < estimate.model_states_gib(2, offloaded["n_params"], 0, 2, 1) / 2
    # offload rows carry the step-time breakdown, printed under the table; ddp has none
    split = offloaded["breakdown"]
    host_adam = split["cpu_adam"] + split["overlapped_cpu_adam"]  # stage 2: the update runs on after step()
    assert split["step"] > 0 and host_adam > 0 and split["gpu_fwd_bwd"] > 0
    assert split["cpu_adam"] + split["gpu_fwd_bwd"] <= split["step"] * 1.01 + 1.0
    assert rows["ddp"]["breakdown"] == {}
    assert "Step-time breakdown" in proc.stdout
    assert "- zero2-nvme: step " in proc.stdout and "- ddp:" not in proc.stdout


def test_eval_batch_search_finds_the_largest_eval_batch(tmp_path):
    """search_eval_batch: after the training batch, the largest eval batch that fits after a training step (each
    try a fresh launch); the training launch evaluates with it and the table has the articles' Eval Size Max."""
    path = tiny_scenario(
        tmp_path,
        "evals",
        [{"name": "ddp", "engine": "ddp"}, {"name": "zero2", "engine": "zero", "stage": 2}],
        samples=64,
        steps=2,
        search_eval_batch=True,
        batch_search={"start": 2, "max": 16},
    )
    proc = zbench("run", path, "--out", str(tmp_path), "--wandb", "off", "--no-progress", faults="eval-oom")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = table(proc.stdout)
    assert rows["ddp"]["Eval size (max)"] == rows["zero2"]["Eval size (max)"] == "6"
    assert rows["ddp"]["Batch size (max)"] == "4 (set)"
    assert "[zero2] eval batch 8: out of memory" in proc.stderr and "[zero2] eval batch 7: out of memory" in proc.stderr
    rows = json.load(open(os.path.join(run_dir(proc.stdout), "results.json")))["variants"]
    assert [r["eval_batch"] for r in rows] == [6, 6]


NVME_SMALL_CHUNKS = {"ZERO_CORE_NVME_CHUNK_NUMEL": "1024"}  # the state file grows with the model, not in 16 Mi chunks


def _disk_scenario(tmp_path) -> str:
    """A model search (n_layer 1, 2) of one variant whose optimizer states go to NVMe."""
    variant = {"name": "nvme", "engine": "zero", "stage": 2, "offload_optimizer": "nvme", "nvme_path": ".",
               "batch_size": 2}
    return tiny_scenario(tmp_path, "disk", [variant], samples=16, steps=1, lr=None,
                         model_search={"key": "n_layer", "values": [1, 2]})


def test_nvme_states_too_big_for_the_disk_are_a_size_that_does_not_fit(tmp_path):
    """A model search whose NVMe states outgrow the disk: the probe is "out of disk space", not a failed run, and
    the search settles on the largest size whose states fit (zero_core's own space check, free space injected)."""
    scenario = _disk_scenario(tmp_path)
    env = NVME_SMALL_CHUNKS
    none_fits = zbench("run", scenario, "--out", str(tmp_path / "a"), "--wandb", "off", env=env, faults="disk-free-1")
    assert none_fits.returncode == 0, none_fits.stderr[-3000:]
    said = re.search(r"\[nvme\] n_layer=1, batch 2: out of disk space \((.*)\)\n", none_fits.stderr)
    assert said and "free space or point nvme_path at a larger disk" in said.group(1)  # where, how much, the fix
    assert table(none_fits.stdout)["nvme"]["Notes"] == "Out of disk space even at n_layer=1"
    need = int(re.search(r"optimizer states need ([\d,]+) bytes", said.group(1)).group(1).replace(",", ""))

    one_fits = zbench("run", scenario, "--out", str(tmp_path / "b"), "--wandb", "off", env=env,
                      faults=f"disk-free-{need}")
    assert one_fits.returncode == 0, one_fits.stderr[-3000:]
    assert "[nvme] n_layer=1, batch 2: fits" in one_fits.stderr
    assert "[nvme] n_layer=2, batch 2: out of disk space" in one_fits.stderr
    row = table(one_fits.stdout)["nvme"]
    assert row["Notes"].startswith("n_layer=1") and row["Tokens/s"] != "–"


def test_a_resumed_search_whose_kept_probes_ran_out_of_disk_names_disk(tmp_path):
    """Every failing probe kept, none launched again: the row still names the disk, as the status lines do."""
    scenario = _disk_scenario(tmp_path)
    env = NVME_SMALL_CHUNKS
    proc = zbench("run", scenario, "--out", str(tmp_path), "--wandb", "off", env=env, faults="disk-free-1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = run_dir(proc.stdout)
    os.remove(os.path.join(folder, "variants", "nvme.json"))  # as if interrupted after the search
    # no fault now: a probe launched again would fit, so only kept outcomes can name the disk
    again = zbench("run", scenario, "--resume", folder, "--wandb", "off", env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert re.search(r"\[nvme\] n_layer=1, batch 2: out of disk space \(.*\) \(kept from the run resumed\)\n",
                     again.stderr)
    assert table(again.stdout)["nvme"]["Notes"] == "Out of disk space even at n_layer=1"
