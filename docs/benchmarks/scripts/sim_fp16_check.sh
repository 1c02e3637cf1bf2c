#!/usr/bin/env bash
# mingpt_largest's zero3 row at n_embd 8192 in fp16, trained 6 steps at n_layer 4 two ways: as rank 0 of 2
# simulated (--simulate-ranks 2) and as one real rank (--gpus 1), to tell a simulation artefact from the
# model's own fp16 behaviour. Prints each run's losses and which steps the loss scaler skipped.
# From the repo root, on one GPU: bash docs/benchmarks/scripts/sim_fp16_check.sh [LR]  (default: the scenario's)
set -uo pipefail
source docs/benchmarks/scripts/gpu_env.sh
mkdir -p runs/sim_check
LR=${1:-} python3 - <<'PY'
import os, yaml
sc = yaml.safe_load(open("scenarios/mingpt_largest.yaml"))
sc.update(name="mingpt_fp16_check", steps=6, model_search={"key": "n_layer", "values": [4]})
sc["variants"] = [v for v in sc["variants"] if v["name"] == "zero3"]
if os.environ["LR"]:
    sc["lr"] = float(os.environ["LR"])
print("lr", sc["lr"])
yaml.safe_dump(sc, open("runs/sim_check/check.yaml", "w"))
PY
for mode in "--simulate-ranks 2" "--gpus 1"; do
  python3 -m zbench.cli run runs/sim_check/check.yaml $mode --out runs/sim_check/out --wandb off --no-progress \
    > "$OUT/sim_check_${mode// /_}.txt" 2>&1
  echo "$mode: rc $?"
  python3 - <<'PY'
import glob, json
r = json.load(open(sorted(glob.glob("runs/sim_check/out/*/variants/zero3.json"))[-1]))
print("losses", [round(x, 4) for x in r.get("losses", [])], "skipped by step", r.get("skipped_by_step"))
PY
done
