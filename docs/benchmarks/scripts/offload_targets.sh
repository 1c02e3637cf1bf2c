#!/usr/bin/env bash
# The one-GPU offload targets in one go, each side by side with its peer where the scenario has one:
#   1. scenarios/gpt7b_offload.yaml's shipped partial offload, twice (TFLOP/s, and the step against the larger
#      of the GPU's own forward+backward and the host AdamW, from zbench's breakdown);
#   2. offload_overlap.py gpt2xl (seed Table 3 beside DeepSpeed, with the "auto" device share);
#   3. the largest GPT of gpt-7b's width that trains: n_layer $LAYERS (44: 9.06 B) with $RATIO of the optimizer
#      states on the host, the rest on the GPU, the host share updated during backward.
# Usage (repo root, one H100/H200; long: run it under detached.sh):
#   bash docs/benchmarks/scripts/offload_targets.sh [gpt7b gpt2xl largest]
set -uo pipefail
source docs/benchmarks/scripts/gpu_env.sh
LAYERS=${LAYERS:-44}; RATIO=${RATIO:-0.75}
(while sleep 20; do date +%T; grep -E "AnonHuge|MemAvail" /proc/meminfo; done > "$OUT/meminfo.txt" &)
run() {  # NAME SCENARIO [args]: one zbench run, its table and its stderr's tail kept
  local name=$1 scenario=$2; shift 2
  python3 -m zbench.cli run "$scenario" --out "$OUT/runs_$name" --wandb off --no-progress "$@" \
    2>"$OUT/${name}_stderr.txt" | tee "$OUT/${name}_table.txt"
  cp "$OUT"/runs_"$name"/*/results.json "$OUT/${name}_results.json" 2>/dev/null
}
for part in ${@:-gpt7b gpt2xl largest}; do
  echo "== $part $(date +%T)"
  case $part in
    gpt7b)
      run gpt7b_a scenarios/gpt7b_offload.yaml --variants zero3-partial-overlap
      run gpt7b_b scenarios/gpt7b_offload.yaml --variants zero3-partial-overlap ;;
    gpt2xl)
      SKIP_KERNELS=1 DEADLINE=${DEADLINE:-700} python3 docs/benchmarks/scripts/offload_overlap.py gpt2xl
      tar czf "$OUT/gpt2xl_rows.tgz" -C "$OUT" gpt2xl_rows ;;
    largest)
      tmp=$(mktemp -d)
      printf '{"zero_optimization": {"offload_optimizer": {"ratio": %s}}, "zero_core": {"overlap_host_update": 1.0}}' \
        "$RATIO" > "$tmp/partial.json"
      python3 - "$tmp" "$LAYERS" <<'EOF'
import sys, yaml
tmp, layers = sys.argv[1], int(sys.argv[2])
sc = yaml.safe_load(open("scenarios/gpt7b_offload.yaml"))
sc["name"] = f"gpt7b_offload_{layers}l"
sc["model"]["overrides"] = {"n_layer": layers}
sc["variants"] = [{"name": "zero3-partial-overlap", "engine": "zero", "stage": 3, "offload_optimizer": "cpu",
                   "ds_config": f"{tmp}/partial.json"}]
yaml.safe_dump(sc, open(f"{tmp}/largest.yaml", "w"), sort_keys=False)
EOF
      run "largest_${LAYERS}l" "$tmp/largest.yaml" ;;
    *) echo "unknown part '$part': gpt7b, gpt2xl or largest"; exit 2 ;;
  esac
done
