#!/usr/bin/env bash
# The largest GPT that trains on ONE GPU with ZeRO-3 + optimizer offload, initialised sharded
# (zero_core.init_context): each try is a fresh process of init_probe.py (init time, peak host memory, TFLOP/s),
# from the smallest size up, stopping at the first that fails; DeepSpeed's zero.Init at the same sizes where
# it fits; then scenarios/mingpt_largest.yaml's model search on one GPU (its table).
# Usage (repo root, one H100, 125 GiB host, 64 GiB disk; outputs in $OUT, default /tmp/out):
#   bash docs/benchmarks/scripts/largest_model.sh
# LAYERS: n_layer values at width 5120 / 40 heads (28: 8.9 B, 32: 10.2 B, 38: 12.1 B, 44: 13.9 B);
# OFFLOAD="opt:param" pairs to try (cpu:cpu, nvme:cpu, cpu:nvme); NVME: folder on the local disk.
set -uo pipefail
source docs/benchmarks/scripts/gpu_env.sh
LAYERS=${LAYERS:-"24 28 32 38 44"}
OFFLOAD=${OFFLOAD:-"cpu:cpu cpu:nvme"}
NVME=${NVME:-/tmp/zb_nvme}
mkdir -p "$NVME"
free -g | tee "$OUT/host_memory.txt"; df -h "$NVME" | tee -a "$OUT/host_memory.txt"
for engine in zero deepspeed; do
  if [ $engine = deepspeed ] && ! python3 -c "import deepspeed" 2>/dev/null; then echo "deepspeed not installed: skipped"; continue; fi
  for pair in $OFFLOAD; do
    opt=${pair%%:*}; param=${pair##*:}
    for layers in $LAYERS; do
      echo "== $engine offload_optimizer=$opt offload_param=$param n_layer=$layers"
      timeout 3000 python3 -m torch.distributed.run --nproc-per-node 1 docs/benchmarks/scripts/init_probe.py \
        --engine $engine --n-layer $layers --offload-optimizer $opt --offload-param $param --nvme-path "$NVME" \
        > "$OUT/probe_${engine}_${opt}_${param}_$layers.txt" 2>&1
      rc=$?
      grep -h '^{' "$OUT/probe_${engine}_${opt}_${param}_$layers.txt" | tee -a "$OUT/largest_model.jsonl"
      if [ $rc -ne 0 ]; then
        echo "   failed (rc $rc): $(grep -hE 'Error|Killed|out of memory' "$OUT/probe_${engine}_${opt}_${param}_$layers.txt" | tail -1)" | tee -a "$OUT/largest_model_failures.txt"
        break  # larger sizes fail too
      fi
    done
  done
done
python3 -m zbench run scenarios/mingpt_largest.yaml --gpus 1 --variants zero3-offload,zero3-offload-nvme --out "$OUT/mingpt_largest_1gpu" 2>&1 | tail -25 | tee "$OUT/mingpt_largest_1gpu.txt"
