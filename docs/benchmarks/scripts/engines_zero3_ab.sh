#!/usr/bin/env bash
# gpt2xl_engines' zero_core ZeRO-3 row alone (no floor, no peers) on 2 GPUs, once per tree, in the order given:
# this checkout's and each `git archive` tree named, switched by PYTHONPATH. From the repo root:
#   bash docs/benchmarks/scripts/engines_zero3_ab.sh new=. old=/path/to/archived/tree ...
set -uo pipefail
source docs/benchmarks/scripts/gpu_env.sh
root=$PWD
python3 - "$OUT/eng3.yaml" <<'PY'
import sys, yaml
sc = yaml.safe_load(open("scenarios/gpt2xl_engines.yaml"))
sc["measure_floor"] = False
sc["variants"] = [v for v in sc["variants"] if v["name"] == "zero3"]
open(sys.argv[1], "w").write(yaml.safe_dump(sc, sort_keys=False))
PY
date -u
for pair in "$@"; do
  label=${pair%%=*}; tree=$(cd "${pair#*=}" && pwd)
  (cd "$tree" && PYTHONPATH=/tmp/site:$tree timeout 300 python3 -m zbench.cli run "$OUT/eng3.yaml" --gpus 2 \
    --out "$OUT/runs_$label" --wandb off --no-progress 2>/dev/null | grep -E "^zero3 " | sed "s/^/$label /")
done
date -u
