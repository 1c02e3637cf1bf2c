#!/usr/bin/env bash
# One scenario through `zbench run` on a GPU machine, keeping the table, results.json, stderr and the whole run
# folder under $OUT (default /tmp/out). From the repo root:
#   bash docs/benchmarks/scripts/scenarios_gpu.sh SCENARIO [zbench run args...]   # SCENARIO: a name in scenarios/
set -uo pipefail
source docs/benchmarks/scripts/gpu_env.sh
scenario=$1; shift
python3 -m zbench.cli run "scenarios/$scenario.yaml" --out "$OUT/runs" --wandb off --no-progress "$@" 2>"$OUT/${scenario}_stderr.txt" | tee "$OUT/${scenario}_table.txt"
rc=${PIPESTATUS[0]}
tail -30 "$OUT/${scenario}_stderr.txt"
cp "$OUT"/runs/*/results.json "$OUT/${scenario}_results.json" 2>/dev/null
tar czf "$OUT/${scenario}_run.tgz" -C "$OUT/runs" . 2>/dev/null  # whole run folders (logs, variant rows) for --resume
exit $rc
