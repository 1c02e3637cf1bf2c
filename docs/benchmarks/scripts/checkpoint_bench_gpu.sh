#!/bin/bash
# Checkpoint I/O on one GPU: zero_core sync/async save, load and convert beside DCP (sync/async) and DeepSpeed
# (where installed), with the disk's O_DIRECT write/read floor measured in the same run, for a 0.77 B model
# (GPT-2 large's parameter count). Run from the repository root on the GPU machine:
#     bash docs/benchmarks/scripts/checkpoint_bench_gpu.sh /path/on/the/disk/to/measure
# Writes docs/benchmarks/<date>_<gpu>_checkpoint.md (the command's record) and prints the table.
set -euo pipefail
dir=${1:-${TMPDIR:-/tmp}}
gpu=$(python -c "import torch; print(torch.cuda.get_device_name(0).split()[1].lower())")
python -m zbench bench checkpoint --params 770000000 --dir "$dir" \
    --record "docs/benchmarks/$(date +%F)_${gpu}_checkpoint.md"
