#!/usr/bin/env bash
# GPU check of the engine: the CPU parity suite on CUDA/NCCL, the kernel benchmark, and
# GPT throughput per stage. Usage (from the repo root, on a 2-GPU machine; outputs in $OUT, default /tmp/out):
#   bash docs/benchmarks/scripts/engine_check.sh [quick|full|overlap|gather|profile|offload]
# quick: the gpu-marked tests on CUDA, kernels, GPT-2 small per stage; full: GPT-2 XL per stage; overlap: the
# floor and stages 1-3 with the gpt2xl_stage*.json configs; gather: weight all-gathers overlapped vs at step end;
# profile: profile_step.py (STAGES="2 3"); offload: CPU/NVMe offload parity and runs (CONFIGS, STEPS).
set -uo pipefail
source docs/benchmarks/scripts/gpu_env.sh
mode=${1:-quick}
if [ "$mode" = quick ]; then
  # every test marked gpu: the parity suite and sharded initialisation (host tensors crossing NCCL)
  ZB_TEST_DEVICE=cuda python3 -m pytest -m gpu tests -q -p no:cacheprovider 2>&1 | tail -15 | tee "$OUT/parity_cuda.txt"
  python3 -m zero_core.kernels.bench --numel 1e9 2>&1 | tee "$OUT/kernels.txt"
  for stage in 0 1 2 3; do
    python3 -m zbench.cli train --model gpt2 --gpus 2 --stage $stage --precision bf16 --seq-len 1024 --micro-batch 8 --steps 10 --warmup 3 --lr 3e-4 2>&1 | grep -E "^(done|step|Traceback|Error|error)|Error" | tee -a "$OUT/train_gpt2.txt"
  done
elif [ "$mode" = overlap ]; then
  python3 docs/benchmarks/scripts/fwd_bwd_floor.py --model gpt2-xl 2>&1 | tee "$OUT/floor.txt"
  for stage in 1 2 3; do
    python3 -m zbench.cli train --model gpt2-xl --gpus 2 --config docs/benchmarks/scripts/gpt2xl_stage$stage.json --seq-len 1024 --steps 8 --warmup 3 2>&1 | grep -E "^(done|Traceback)|Error" | tee -a "$OUT/train_gpt2xl_overlap.txt"
  done
elif [ "$mode" = gather ]; then
  # stages 1-2: weight all-gathers overlapped with the optimizer and the next forward (default) vs all
  # gathered at the end of the step (zero_core.overlap_weight_gather: false), back to back
  ZB_TEST_DEVICE=cuda python3 -m pytest tests/test_weight_gather.py tests/test_gradient_checkpointing.py -q -p no:cacheprovider -k "not scenario" 2>&1 | tail -3 | tee "$OUT/gather_tests_cuda.txt"
  for cfg in ${CONFIGS:-stage2 stage2_eager_gather stage1 stage1_eager_gather}; do
    python3 -m zbench.cli train --model gpt2-xl --gpus 2 --config docs/benchmarks/scripts/gpt2xl_$cfg.json --seq-len 1024 --steps ${STEPS:-10} --warmup 3 2>&1 | grep -E "^(done|Traceback)|Error" | sed "s/^/$cfg: /" | tee -a "$OUT/train_gpt2xl_gather.txt"
  done
elif [ "$mode" = profile ]; then
  for stage in ${STAGES:-2 3}; do
    python3 -m torch.distributed.run --nproc-per-node 2 docs/benchmarks/scripts/profile_step.py --config docs/benchmarks/scripts/gpt2xl_stage$stage.json 2>&1 | grep -vE "^(USDT|W1|\*)" | sed "s/^/stage$stage: /" | tee -a "$OUT/profile_gpt2xl.txt"
  done
elif [ "$mode" = offload ]; then
  # CONFIGS picks the runs (gpt2xl_<name>.json); the nvme one writes its state files under /tmp/zb_nvme
  # (about 9.4 GB per rank at GPT-2 XL; ~15 s/step on the lent machines' virtual disk, so
  # CONFIGS="stage2_offload stage3_offload" for speed only); each run prints its step-time breakdown
  ZB_TEST_DEVICE=cuda python3 -m pytest tests/test_engine_parity.py tests/test_host_offload.py -q -p no:cacheprovider -k "offload or stage2 or nvme or chunked" 2>&1 | tail -3 | tee "$OUT/parity_offload_cuda.txt"
  mkdir -p /tmp/zb_nvme
  for cfg in ${CONFIGS:-stage2_offload stage3_offload stage2_nvme}; do
    python3 -m zbench.cli train --model gpt2-xl --gpus 2 --config docs/benchmarks/scripts/gpt2xl_$cfg.json --seq-len 1024 --steps ${STEPS:-5} --warmup 2 2>&1 | grep -E "^(done|breakdown|Traceback)|Error|pinned" | sed "s/^/$cfg: /" | tee -a "$OUT/train_gpt2xl_offload.txt"
  done
else
  for stage in 0 1 2 3; do
    python3 -m zbench.cli train --model gpt2-xl --gpus 2 --stage $stage --precision bf16 --seq-len 1024 --micro-batch 8 --steps 8 --warmup 3 --lr 1e-4 2>&1 | grep -E "^(done|step|Traceback)|Error" | tee -a "$OUT/train_gpt2xl.txt"
  done
fi
