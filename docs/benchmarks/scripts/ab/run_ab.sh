#!/usr/bin/env bash
# A/B runs of 2026-11-23 on nvidia-h200-x2. Usage: bash docs/benchmarks/scripts/ab/run_ab.sh MODE... (tests control blocking probe gpt2xl final buckets deberta offload ctas dynamic dynab memprobe dyn48 b40x b40plain simmem simdeb simcompile simgpt simruns simrunc simcompiled compiled1 simsearch sim8)
set -uo pipefail
source docs/benchmarks/scripts/gpu_env.sh
ab=docs/benchmarks/scripts/ab
# control and buckets compare with the reducer before this A/B (zero-filled buckets + add); the device machine
# gets no .git, so write it here first: git show cb61518:zero_core/grad_reducer.py > docs/benchmarks/scripts/ab/grad_reducer_add.py
run() {  # run NAME SCENARIO: the table on stdout, the run folder's results.json kept
  name=$1; shift
  python3 -m zbench.cli run "$@" --out "$OUT/runs_$name" --wandb off --no-progress 2>"$OUT/${name}_stderr.txt" | tee "$OUT/${name}_table.txt"
  tail -8 "$OUT/${name}_stderr.txt"
  cp "$OUT"/runs_$name/*/results.json "$OUT/${name}_results.json" 2>/dev/null
}
for mode in "$@"; do
case $mode in
tests)
  ZB_TEST_DEVICE=cuda python3 -m pytest tests/test_weight_gather.py tests/test_grad_buffers.py -q -p no:cacheprovider \
    --tb=short -k "${TESTS:-master or unwritten or repeats}" >"$OUT/tests_cuda.txt" 2>&1; grep -E "^E |^FAILED|passed|failed" "$OUT/tests_cuda.txt" | tail -40 ;;
control)  # the same tests with the previous reducer (zeroed buffers + add): the poison patch is then inert,
  # so test_grad_buffers compares two clean runs (a run-to-run determinism check)
  cp zero_core/grad_reducer.py /tmp/grad_reducer_copy.py; cp $ab/grad_reducer_add.py zero_core/grad_reducer.py
  ZB_TEST_DEVICE=cuda python3 -m pytest tests/test_weight_gather.py tests/test_grad_buffers.py -q -p no:cacheprovider \
    --tb=line -k "${TESTS:-master or unwritten or repeats or deferred}" >"$OUT/tests_cuda_control.txt" 2>&1; grep -E "^/|^FAILED|passed|failed" "$OUT/tests_cuda_control.txt" | tail -20
  cp /tmp/grad_reducer_copy.py zero_core/grad_reducer.py ;;
probe) python3 $ab/cast_probe.py 2>&1 | tee "$OUT/cast_probe.txt" ;;
blocking)  # the same tests with every kernel launch synchronous: a stream race would disappear
  CUDA_LAUNCH_BLOCKING=1 ZB_TEST_DEVICE=cuda python3 -m pytest tests/test_weight_gather.py tests/test_grad_buffers.py -q \
    -p no:cacheprovider --tb=line -k "${TESTS:-master or unwritten or repeats or deferred}" >"$OUT/tests_cuda_blocking.txt" 2>&1
  grep -E "^/|^FAILED|passed|failed" "$OUT/tests_cuda_blocking.txt" | tail -20 ;;
gpt2xl) run gpt2xl_ab $ab/gpt2xl_engines_ab.yaml ;;
final) run gpt2xl_final $ab/gpt2xl_engines_final.yaml ;;
buckets)
  # gradient buckets: copy into fresh uninitialised buffers (this commit) vs zeroed buffers + add (before), ABA
  cp zero_core/grad_reducer.py /tmp/grad_reducer_copy.py
  for version in copy add copy; do
    if [ $version = add ]; then cp $ab/grad_reducer_add.py zero_core/grad_reducer.py; else cp /tmp/grad_reducer_copy.py zero_core/grad_reducer.py; fi
    python3 -m zbench.cli train --model gpt2-xl --gpus 2 --config docs/benchmarks/scripts/gpt2xl_stage2.json --seq-len 1024 \
      --steps 10 --warmup 3 2>&1 | grep -E "^(done|Traceback)|Error" | sed "s/^/$version: /" | tee -a "$OUT/buckets_aba.txt"
  done
  cp /tmp/grad_reducer_copy.py zero_core/grad_reducer.py ;;
deberta) run deberta_b40 $ab/deberta_b40.yaml ;;
ctas)  # next lever for ZeRO-2's distance from the floor (not run yet): reduce-scatter kernels that wait for
  # the peer sit on SMs through backward (80 ms of them per step in the 2026-11-22 profile) while the traffic
  # needs little bandwidth; cap NCCL's CTAs (one per channel) and time the stage-2 step, A/B/A
  for n in default ${CTAS:-4 8 16} default; do
    if [ $n = default ]; then unset NCCL_MAX_CTAS; else export NCCL_MAX_CTAS=$n; fi
    python3 -m zbench.cli train --model gpt2-xl --gpus 2 --config docs/benchmarks/scripts/gpt2xl_stage2.json --seq-len 1024 \
      --steps 10 --warmup 3 2>&1 | grep -E "^(done|Traceback)|Error" | sed "s/^/ctas $n: /" | tee -a "$OUT/ctas.txt"
  done
  unset NCCL_MAX_CTAS ;;
dynamic) bash docs/benchmarks/scripts/scenarios_gpu.sh deberta_mrpc_dynamic ;;  # issue 5's DeBERTa target, as the article padded
dynab) run deberta_dynamic $ab/deberta_dynamic_ab.yaml ;;  # the same, ZeRO-2 engines only, search from 32
dyn48) run deberta_dyn48 $ab/deberta_dynamic_b48.yaml ;;  # both ZeRO-2 engines at batch 48, as the article padded
b40x) run deberta_b40x $ab/deberta_b40_expandable.yaml ;;  # full padding, batch 40, expandable segments for every engine
b40plain) run deberta_b40plain $ab/deberta_b40.yaml --variants zero2-b5e7 ;;  # the same without expandable segments
memprobe)  # where DeBERTa's memory goes at full padding (no cap): zero_core vs DeepSpeed ZeRO-2 at 32, zero_core at 40
  for probe in ${PROBES:-zero2:32 ds-zero2:32 zero2:40}; do
    python3 -m torch.distributed.run --nproc-per-node 2 $ab/memory_probe.py scenarios/deberta_mrpc.yaml ${probe%:*} ${probe#*:} 3 \
      >"$OUT/memprobe_${probe/:/_}.txt" 2>&1; grep -A40 "^== " "$OUT/memprobe_${probe/:/_}.txt" || tail -20 "$OUT/memprobe_${probe/:/_}.txt"
  done ;;
# one GPU, rank 0 of 2 simulated (sim_world.py): per-rank memory and the compute part of the step, no NCCL
simmem)  # DeBERTa b40 at full padding: what is alive at rank 0's peak, no cap
  SIM_WORLD=2 python3 $ab/memory_probe.py scenarios/deberta_mrpc.yaml zero2 40 3 >"$OUT/simmem.txt" 2>&1
  grep -A40 "^== " "$OUT/simmem.txt" || tail -20 "$OUT/simmem.txt" ;;
simdeb)  # the same under the 24 GiB cap, default allocator then expandable segments; the floor once
  SIM_WORLD=2 TIMING=1 FLOOR=1 python3 $ab/memory_probe.py scenarios/deberta_mrpc.yaml zero2 ${BATCH:-40} 6 >"$OUT/simdeb.txt" 2>&1
  grep -E "step|median|Error" "$OUT/simdeb.txt" | tail -16
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True SIM_WORLD=2 TIMING=1 python3 $ab/memory_probe.py scenarios/deberta_mrpc.yaml \
    zero2 ${BATCH:-40} 6 >"$OUT/simdeb_x.txt" 2>&1; grep -E "step|Error" "$OUT/simdeb_x.txt" | tail -14 ;;
simcompile)  # the same with each DeBERTa layer's forward compiled (torch.compile), expandable segments
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True COMPILE=1 SIM_WORLD=2 TIMING=1 FLOOR=1 python3 $ab/memory_probe.py \
    scenarios/deberta_mrpc.yaml zero2 ${BATCH:-40} 6 >"$OUT/simcompile.txt" 2>&1; grep -E "step|median|Error" "$OUT/simcompile.txt" | tail -16 ;;
simgpt)  # GPT-2 XL stage 2, micro-batch 8: the engine's step without communication against the floor
  SIM_WORLD=2 TIMING=1 FLOOR=1 python3 $ab/memory_probe.py scenarios/gpt2xl_engines.yaml zero2 8 8 >"$OUT/simgpt.txt" 2>&1
  grep -E "step|median|Error" "$OUT/simgpt.txt" | tail -12 ;;
simruns)  # the runner's own loop, simulated rank 0 of 2: b40 with expandable segments, b32 as the 2026-11-22 table ran
  for r in "$ab/deberta_b40_expandable.yaml zero2 40" "scenarios/deberta_mrpc.yaml zero2 32"; do
    read -r f v b <<<"$r"; log="$OUT/simrun_$(basename $f .yaml)_$b.txt"
    SIM_WORLD=2 python3 $ab/sim_run.py $f $v $b >"$log" 2>&1; echo "== sim_run $r"; grep -E "^(epoch|loss|\{)|Error" "$log"
  done ;;
simrunc)  # the same b40 run with each DeBERTa layer compiled
  COMPILE=1 SIM_WORLD=2 python3 $ab/sim_run.py $ab/deberta_b40_expandable.yaml zero2 40 >"$OUT/simrun_compile.txt" 2>&1
  echo "== sim_run compiled b40"; grep -E "^(epoch|loss|\{)|Error" "$OUT/simrun_compile.txt" ;;
simcompiled)  # compiled DeBERTa: the runner's loop at 48 (3 epochs), then which batch fits the cap; GPT-2 XL compiled vs its floor
  log="$OUT/simrun_compiled_48.txt"; SIM_WORLD=2 python3 $ab/sim_run.py scenarios/deberta_mrpc_compiled.yaml zero2 48 >"$log" 2>&1
  echo "== sim_run compiled 48"; grep -E "^(epoch|loss|\{)|Error" "$log"
  for b in ${BATCHES:-64 56}; do
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True COMPILE=1 SIM_WORLD=2 TIMING=1 python3 $ab/memory_probe.py \
      scenarios/deberta_mrpc.yaml zero2 $b 4 >"$OUT/simfit_$b.txt" 2>&1; echo "== compiled batch $b"; grep -E "^cap step|Error" "$OUT/simfit_$b.txt" | tail -3
  done
  COMPILE=1 SIM_WORLD=2 TIMING=1 FLOOR=1 python3 $ab/memory_probe.py scenarios/gpt2xl_engines.yaml zero2 8 8 >"$OUT/simgpt_compiled.txt" 2>&1
  echo "== GPT-2 XL compiled"; grep -E "step [4-7]|median|Error" "$OUT/simgpt_compiled.txt" | tail -6 ;;
compiled1) run deberta_compiled_1gpu $ab/deberta_compiled_1gpu.yaml ;;  # the compile key through the runner, one GPU
simsearch) run deberta_sim_search $ab/deberta_sim_search.yaml --simulate-ranks 2 ;;  # the product flag vs 2026-11-22's 2-GPU search
sim8) run gpt2xl_sim8 $ab/gpt2xl_sim8.yaml --simulate-ranks 8 ;;  # issue 8's engines table: memory per GPU at 8 ranks
offload) run gpt2xl_offload_sbs $ab/gpt2xl_engines_offload.yaml ;;
*) echo "unknown mode $mode"; exit 2 ;;
esac
done
