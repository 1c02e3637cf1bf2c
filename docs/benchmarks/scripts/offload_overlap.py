"""Partial optimizer offload and host updates started during backward, side by side with DeepSpeed and the
plain offload path, on one GPU (the offload scenarios of docs/benchmarks).

For each scenario it writes a copy of the scenario YAML with extra variants (and the DeepSpeed JSONs they
use) into a temporary folder and runs `zbench run` on it:
  gpt2xl_offload        batch 16, 24 GiB cap, ZeRO-3 + optimizer and parameter offload, fp16 (exact mode)
  longformer_feedback   batch 10, 16 GiB cap, ZeRO-2 + optimizer offload, fp16
  gpt7b_offload         batch 32 x 1024, bf16, ZeRO-3 + optimizer offload (a DeepSpeed variant is added)
Each gets: the scenario's own zero_core and DeepSpeed variants, then zero_core with offload_optimizer.ratio R
(the first buckets on the GPU) and with zero_core.overlap_host_update F. zero_core's default runs the host update
on its own thread after step() (zero_core.overlap_weight_gather, stages 1-3); the "-in-step" variants keep it
inside step() (the old path), e.g. gpt2xl's zero-ratio1-overlap0-in-step against the scenario's zero3-offload.
First, `python -m zero_core.kernels.bench --numel 1e9`: the host AdamW against the host's copy bandwidth.

Usage (repo root, one H100/H200; outputs under $OUT, default /tmp/out):
    python3 docs/benchmarks/scripts/offload_overlap.py [gpt2xl longformer gpt7b]
(VARIANTS=a,b runs only those variants of each scenario, e.g. full offload against a device share:
VARIANTS=zero3-offload,zero-ratio0p92-overlap0p5 ... gpt2xl;
SKIP_KERNELS=1 leaves out the kernel bench; DEADLINE=S interrupts each run after S seconds (SIGINT: zbench
stops cleanly and keeps the finished variants). Every finished variant's row is copied to $OUT/<scenario>_rows/.)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
SCENARIOS = ROOT / "scenarios"
# scenario -> (batch, the zero_core variants to add: (offload ratio or "auto", overlap_host_update,
# overlap_weight_gather[, gradient_checkpointing[, offload_stream_fraction[, stage3_max_reuse_distance (None: the
# config's)[, offload_stream_hold_grads[, offload_stream_balance]]]]]));
# (R, F, False) keeps the host update inside step() (the old path); True runs it on after step()
PLANS = {
    "gpt2xl": (
        "gpt2xl_offload.yaml",
        16,
        # device shares within DeepSpeed's 8.1 GiB: 0.92 fits (7.79 GiB), 0.9 does not (8.19); with recomputed
        # blocks 0.82 fits (8.09) and 0.8 does not (8.60), but runs slower than 0.92 without
        # (2026-11-26_h100_gpt2xl_recompute_shares.md); the whole host share offered to backward, as the 7 B GPT
        # runs fastest (0.95 keeps nothing on the device: its 5% is less than the first bucket, the token
        # embedding); "auto": the share that fits the 24 GiB cap
        # the host share's front streamed to the GPU's update (zero_core.offload_stream_fraction): no device
        # memory beyond its chunk buffers, so it fits beside full offload and beside 0.92
        [(0.92, 0.5, True), (0.92, 1.0, True), ("auto", 1.0, True),
         (0.8, 1.0, True, True), (0.82, 1.0, True, True), (0.85, 1.0, True, True),
         (1.0, 0.0, True, False, 0.45), (1.0, 0.0, True, False, 0.55), (0.92, 0.0, True, False, 0.5),
         (0.92, 0.0, True, False, 0.6), (1.0, 0.0, True, False, 0.65), (1.0, 1.0, True, False, 0.55),
         (1.0, 0.0, True, False, 0.6), (1.0, 0.0, True, False, 0.7),
         # recomputed blocks free the activations for a device share, whose elements cost no host traffic at all;
         # DeepSpeed's reuse distance (the last 16 blocks kept gathered into backward: 1 GiB) off to make room
         (0.85, 0.0, True, True, 0.6, 0), (0.82, 0.0, True, True, 0.6, 0), (0.88, 0.0, True, True, 0.6),
         (0.92, 0.0, True, False, 0.6, 0),
         # the streamed chunks' gradients held on the device from backward to the update
         (1.0, 0.0, True, False, 0.55, None, True), (1.0, 0.0, True, False, 0.6, None, True),
         (1.0, 0.0, True, False, 0.7, None, True),
         # ... beside the 8% device share that still fits DeepSpeed's memory (held buffers add no allocated peak)
         (0.92, 0.0, True, False, 0.6, None, True),
         # a smaller own share, the rest taken from the host's end as the GPU frees (offload_stream_balance)
         (1.0, 0.0, True, False, 0.5, None, True),
         (1.0, 0.0, True, False, 0.6, None, True, False)],  # the shipped split, fixed (the engine before balancing)
    ),
    "longformer": (
        "longformer_feedback.yaml",
        10,
        [(1.0, 0.0, False), (1.0, 0.0, True), (0.5, 0.0, True), (0.25, 0.0, True), (0.25, 1.0, True)],
    ),
    # the shipped share (0.55) with more of the host share offered to backward: what backward has not reached
    # when it ends is left to the step, so a larger fraction costs backup memory, not a longer step
    # ... and with some of the host share's chunks streamed to the GPU's update
    "gpt7b": ("gpt7b_offload.yaml", 32, [(0.55, 0.6, True), (0.55, 0.8, True), (0.55, 1.0, True), ("auto", 1.0, True),
                                         (0.55, 1.0, True, False, 0.3), (0.55, 1.0, True, False, 0.5)]),
}
GPT7B_DS = {  # the scenario's zero_core variant as a DeepSpeed JSON, so DeepSpeed runs it too
    "bf16": {"enabled": True},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True}, "overlap_comm": True},
    "gradient_clipping": "auto",
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": 1,
}


def variants_for(sc: dict, base_json: dict, folder: Path, plan: list[tuple]) -> list[dict]:
    engine = next((v for v in sc["variants"] if v.get("engine") == "zero"), None)
    out = [v for v in sc["variants"] if v.get("engine") != "ddp"]
    if not any(v.get("engine") == "deepspeed" for v in out):
        (folder / "plain.json").write_text(json.dumps(base_json))
        out.append({"name": "ds-offload", "engine": "deepspeed", "ds_config": "plain.json"})
    for ratio, overlap, in_flight, *extra in plan:
        defaults = [False, 0.0, None, False, True]  # hold False: a row stages its gradients unless it says -hold
        recompute, stream, reuse, hold, balance = list(extra) + defaults[len(extra):]
        cfg = json.loads(json.dumps(base_json))
        cfg["zero_optimization"]["offload_optimizer"]["ratio"] = ratio
        cfg["zero_core"] = {"overlap_host_update": overlap, "overlap_weight_gather": in_flight,
                            "offload_stream_fraction": stream, "offload_stream_hold_grads": hold,
                            "offload_stream_balance": balance}
        if reuse is not None:
            cfg["zero_optimization"]["stage3_max_reuse_distance"] = reuse
        share = ratio if isinstance(ratio, str) else f"{ratio:g}"  # "auto": the device share that fits the cap
        name = f"zero-ratio{share}-overlap{overlap:g}{'' if in_flight else '-in-step'}"
        name = (name + ("-recompute" if recompute else "") + (f"-stream{stream:g}" if stream else "")
                + ("" if reuse is None else f"-reuse{reuse:g}") + ("-hold" if hold else "")
                + ("" if balance else "-fixed")).replace(".", "p")
        (folder / f"{name}.json").write_text(json.dumps(cfg, indent=1))
        # the scenario variant's own keys (stage, offload devices) apply to its siblings too
        kept = {k: engine[k] for k in ("stage", "offload_optimizer", "offload_param") if engine and k in engine}
        if recompute:
            kept["gradient_checkpointing"] = True
        out.append({"name": name, "engine": "zero", "ds_config": f"{name}.json", **kept})
    return out


def run_until_deadline(cmd: list[str], log: Any) -> int:
    """Run `cmd`; past $DEADLINE seconds, interrupt it as Ctrl-C would (its finished variants stay)."""
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        return proc.wait(timeout=float(os.environ["DEADLINE"]) if os.environ.get("DEADLINE") else None)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        return proc.wait()


def main(which: list[str]) -> int:
    out_dir = Path(os.environ.get("OUT", "/tmp/out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    failed = 0
    with open(out_dir / "offload_overlap_kernels.txt", "w") as log:  # host AdamW against the host's copy bandwidth
        failed += not os.environ.get("SKIP_KERNELS") and (
            subprocess.call(
                [sys.executable, "-m", "zero_core.kernels.bench", "--numel", "1e9"],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
            )
            != 0
        )
    print((out_dir / "offload_overlap_kernels.txt").read_text(), flush=True)
    for key in which:
        file, batch, plan = PLANS[key]
        sc = yaml.safe_load((SCENARIOS / file).read_text())
        with tempfile.TemporaryDirectory(prefix="offload_overlap_") as tmp:
            folder = Path(tmp)
            ds = next((v["ds_config"] for v in sc["variants"] if v.get("ds_config")), None)
            base = json.loads((SCENARIOS / ds).read_text()) if ds else json.loads(json.dumps(GPT7B_DS))
            for v in sc["variants"]:  # every variant's own JSON beside the copied scenario
                if v.get("ds_config"):
                    shutil.copy(SCENARIOS / v["ds_config"], folder / Path(v["ds_config"]).name)
                    v["ds_config"] = Path(v["ds_config"]).name
            sc["variants"] = variants_for(sc, base, folder, plan)
            sc["batch_size"] = batch
            sc.pop("batch_search", None)
            for name in ("data",):  # relative data paths stay valid from the temporary folder
                if isinstance(sc.get(name), dict) and "path" in sc[name]:
                    sc[name]["path"] = str((SCENARIOS / sc[name]["path"]).resolve())
            path = folder / file
            path.write_text(yaml.safe_dump(sc, sort_keys=False))
            cmd = [
                sys.executable,
                "-m",
                "zbench.cli",
                "run",
                str(path),
                "--out",
                str(out_dir / "runs"),
                "--no-progress",
                "--wandb",
                "off",
            ]
            if os.environ.get("VARIANTS"):  # a subset, e.g. VARIANTS=zero-ratio0p5-overlap0
                cmd += ["--variants", os.environ["VARIANTS"]]
            print("+", " ".join(cmd), flush=True)
            with open(out_dir / f"offload_overlap_{key}.txt", "w") as log:
                failed += run_until_deadline(cmd, log) != 0
            rows = out_dir / f"{key}_rows"
            rows.mkdir(exist_ok=True)
            for row in (out_dir / "runs").glob(f"{path.stem}-*/variants/*.json"):
                shutil.copy(row, rows / row.name)
            print((out_dir / f"offload_overlap_{key}.txt").read_text()[-6000:], flush=True)
    return failed


if __name__ == "__main__":
    unknown = [k for k in sys.argv[1:] if k not in PLANS]
    if unknown:
        sys.exit(f"Error: unknown scenario {unknown[0]!r}; name some of {', '.join(PLANS)} (or none for all)")
    sys.exit(main(sys.argv[1:] or list(PLANS)))
