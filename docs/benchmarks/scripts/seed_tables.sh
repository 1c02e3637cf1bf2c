#!/usr/bin/env bash
# The seed articles' tables as a user runs them: every shipped scenario that fits one GPU, as shipped (the
# 2-GPU ones as rank 0 of 2 with --simulate-ranks 2), on ONE lent GPU, in parts that each fit a 10-minute call.
# From the repo root:
#   bash docs/benchmarks/scripts/seed_tables.sh PART      # PART: table2 ... mingpt-nvme (below)
# Each call stops itself before DEADLINE seconds (default 560) with SIGINT, which zbench turns into a clean stop
# that keeps every finished variant; calling the same PART again resumes the unfinished run folder under
# runs/seed/ (kept between calls while the machine stays warm, or carried to a fresh one: carry "runs/seed" on
# that machine's FIRST call only, since carrying replaces the folder, under any run still writing to it)
# and skips scenarios already done; a batch search goes on from its last probe (variants/*.probes.json). A part prints
# "PART: done" once all its scenarios have results.json. Tables, results.json and stderr go to $OUT.
#
# Parts, in order of value, with the expected wall time on one H100 (probe launches ~30-60 s each):
#   table2       seed Table 2, BlenderBot-400M (random init), --simulate-ranks 2: train batch search 25..512 and
#                the "Eval size (max)" search for ddp and zero2 (ds-zero2 says why it cannot simulate):
#                ~28 probes, ~16 min -> 2 calls
#   table2-1gpu  the same scenario on one real GPU (--gpus 1) at the batches table2 found, no memory cap,
#                every row incl. DeepSpeed's: the one-GPU timing, ~5 min
#   table3       seed Table 3, GPT-2 XL fp16 + ZeRO-3 CPU offload on one 24 GiB-capped GPU, ddp / zero_core /
#                DeepSpeed, batch search 1..64: each probe ~1 min (DeepSpeed's longer), ~35 min -> 4 calls
#   table4       seed Table 4, Longformer-base-4096, one 16 GiB-capped GPU, ZeRO-2 + offload vs ddp, batch
#                search 1..64 per variant (is batch 10 still "only with offload"?): ~16 min -> 2 calls
#   table1       seed Table 1, DeBERTa-v2-xlarge MRPC-sized, --simulate-ranks 2: ~8 min
#   tiny         quickstart, mrpc_tiny, seq2seq_tiny on the GPU (--simulate-ranks 2): ~4 min
#   engines      gpt2xl_engines (--simulate-ranks 2, DeepSpeed rows say why not): ~5 min
#   gpt7b        gpt7b_offload, a 7 B GPT with ZeRO-3 + optimizer offload on the one GPU: ~5 min
#   gpt12b       gpt12b_three_way, a 12.3 B GPT whose optimizer states span GPU, host memory and NVMe; host memory
#                and disk logged every 10 s to $OUT/gpt12b_memory.txt; if it fails, once more with less in host
#                memory (ratio 0.8, nvme_host_ratio 0.5): ~5 min per try
#   mingpt-1gpu  mingpt_largest's n_layer search on the one GPU (--gpus 1), optimizer offload to host and NVMe
#   extra        deberta_mrpc_dynamic, deberta_mrpc_compiled, mingpt_largest (--simulate-ranks 2): ~40 min, 4+ calls
#   mingpt-zero3 mingpt_largest's zero3 row alone (--simulate-ranks 2), GPU-resident: ~10 min
#   mingpt-host  mingpt_largest's zero3-offload row alone (--simulate-ranks 2): each probe builds a 6-26 B
#                candidate sharded on the host (minutes each): ~15 min, so start it with detached.sh
#   mingpt-nvme  its zero3-offload-nvme row: every step moves 24 bytes per parameter of rank 0's share through the
#                disk (~33 s a step at 6.4 B); candidates too big for the disk are "out of disk space": ~25 min,
#                detached.sh, with DEADLINE past the run (the 10-minute limit is the device call's, not the run's)
# table2..table4 (the seed tables not yet run on a GPU) take about 6 calls; all parts about 14.
set -uo pipefail
source docs/benchmarks/scripts/gpu_env.sh > "$OUT/env.txt" 2>&1; cat "$OUT/env.txt"
python3 -c 'import importlib.metadata as m
for p in ("transformers", "deepspeed", "wandb"):
    try: print(p, m.version(p))
    except m.PackageNotFoundError: print(p, "not installed")' | tee -a "$OUT/env.txt"
part=${1:?name a part: table2 table2-1gpu table3 table4 table1 tiny engines gpt7b gpt12b mingpt-1gpu extra mingpt-zero3 mingpt-host mingpt-nvme}
DEADLINE=${DEADLINE:-560}
START=$SECONDS
SEED=runs/seed
mkdir -p "$SEED"

# run LABEL SCENARIO_FILE [zbench run args...]: start, resume or skip one scenario; 1 when out of time
run() {
  local label=$1 file=$2; shift 2
  local parent="$SEED/$label" left=$((DEADLINE - (SECONDS - START)))
  local dir; dir=$(ls -d "$parent"/*/ 2>/dev/null | tail -1)
  if [ -n "$dir" ] && [ -f "$dir/results.json" ]; then echo "$label: done earlier ($dir)"; return 0; fi
  if [ "$left" -lt 60 ]; then echo "$label: not started, out of time; call this part again"; return 1; fi
  local resume=(); [ -n "$dir" ] && resume=(--resume "${dir%/}")
  echo "$label: zbench run $file $* ${resume[*]} (up to ${left}s)"
  timeout -s INT "$left" python3 -m zbench.cli run "$file" --out "$parent" --wandb off --no-progress "$@" "${resume[@]}" \
    2>"$OUT/${label}_stderr.txt" | tee "$OUT/${label}_table.txt"
  local rc=${PIPESTATUS[0]}
  tail -5 "$OUT/${label}_stderr.txt"
  dir=$(ls -d "$parent"/*/ 2>/dev/null | tail -1)
  [ -n "$dir" ] && cp "$dir/table.md" "$OUT/${label}_table.md" 2>/dev/null
  [ -n "$dir" ] && cp "$dir/results.json" "$OUT/${label}_results.json" 2>/dev/null
  [ "$rc" = 130 ] || [ "$rc" = 124 ] && { echo "$label: interrupted at the deadline; call this part again"; return 1; }
  return 0  # a failed variant is a row of the table (its error is in the stderr file)
}

# The one-GPU BlenderBot scenario: table2's searched batches per variant (DeepSpeed takes zero2's), the smallest
# searched eval batch, no memory cap (memory per rank differs from the 2-rank run's; this part times it).
one_gpu_blenderbot() {
  python3 - "$SEED" <<'EOF'
import glob, json, os, sys, yaml
seed = sys.argv[1]
found = sorted(glob.glob(f"{seed}/table2/*/results.json"))
if not found:
    sys.exit("run part table2 first")
rows = {r["variant"]: r for r in json.load(open(found[-1]))["variants"] if r["status"] == "ok"}
sc = yaml.safe_load(open("scenarios/blenderbot_mudoconv.yaml"))
sc.update(name="blenderbot_mudoconv_1gpu", gpus=1, search_eval_batch=False)
sc.pop("gpu_memory_cap_gib", None)
evals = [r["eval_batch"] for r in rows.values() if r.get("eval_batch")]
if evals:
    sc["eval_batch_size"] = min(evals)
for v in sc["variants"]:
    twin = rows.get(v["name"]) or rows.get(v["name"].removeprefix("ds-"))
    if twin:
        v["batch_size"] = twin["batch"]
    if "ds_config" in v:
        v["ds_config"] = os.path.abspath(os.path.join("scenarios", v["ds_config"]))
json.dump(sc, open(f"{seed}/blenderbot_1gpu.yaml", "w"), indent=1)  # JSON is YAML
print("one-GPU scenario:", {v["name"]: v.get("batch_size") for v in sc["variants"]}, "eval", sc.get("eval_batch_size"))
EOF
}

# The 12 B scenario, then (if it did not train) a copy with a smaller host share, under a memory logger.
gpt12b() {
  (while true; do date +%T; free -g | sed -n 2p; df -h /tmp | tail -1; sleep 10; done) > "$OUT/gpt12b_memory.txt" 2>&1 &
  local logger=$!
  run gpt12b scenarios/gpt12b_three_way.yaml
  local rc=$?
  if [ "$rc" = 0 ] && ! grep -q '"status": "ok"' "$OUT/gpt12b_results.json" 2>/dev/null; then
    python3 - "$SEED" <<'EOF'
import json, os, sys, yaml
sc = yaml.safe_load(open("scenarios/gpt12b_three_way.yaml"))
sc["name"] = "gpt12b_three_way_safer"
cfg = {"zero_optimization": {"offload_optimizer": {"ratio": 0.8}}, "zero_core": {"nvme_host_ratio": 0.5}}
json.dump(cfg, open(f"{sys.argv[1]}/gpt12b_safer.json", "w"))
sc["variants"][0]["ds_config"] = os.path.abspath(f"{sys.argv[1]}/gpt12b_safer.json")
json.dump(sc, open(f"{sys.argv[1]}/gpt12b_safer.yaml", "w"), indent=1)  # JSON is YAML
EOF
    run gpt12b_safer "$SEED/gpt12b_safer.yaml"; rc=$?
  fi
  kill "$logger"
  return $rc
}

ok=0
case "$part" in
  table2) run table2 scenarios/blenderbot_mudoconv.yaml --simulate-ranks 2 || ok=1 ;;
  table2-1gpu) one_gpu_blenderbot && run table2-1gpu "$SEED/blenderbot_1gpu.yaml" || ok=1 ;;
  table3) run table3 scenarios/gpt2xl_offload.yaml || ok=1 ;;
  table4) run table4 scenarios/longformer_feedback.yaml || ok=1 ;;
  table1) run table1 scenarios/deberta_mrpc.yaml --simulate-ranks 2 || ok=1 ;;
  tiny) for s in quickstart mrpc_tiny seq2seq_tiny; do run "$s" "scenarios/$s.yaml" --simulate-ranks 2 || { ok=1; break; }; done ;;
  engines) run gpt2xl_engines scenarios/gpt2xl_engines.yaml --simulate-ranks 2 || ok=1 ;;
  gpt7b) run gpt7b_offload scenarios/gpt7b_offload.yaml || ok=1 ;;
  gpt12b) gpt12b || ok=1 ;;
  mingpt-1gpu) run mingpt_1gpu scenarios/mingpt_largest.yaml --gpus 1 --variants zero3-offload,zero3-offload-nvme \
                 || ok=1 ;;
  mingpt-zero3) run mingpt_zero3 scenarios/mingpt_largest.yaml --simulate-ranks 2 --variants zero3 || ok=1 ;;
  mingpt-host) run mingpt_host scenarios/mingpt_largest.yaml --simulate-ranks 2 --variants zero3-offload || ok=1 ;;
  mingpt-nvme) df -h /tmp; run mingpt_nvme scenarios/mingpt_largest.yaml --simulate-ranks 2 \
                 --variants zero3-offload-nvme || ok=1 ;;
  extra) for s in deberta_mrpc_dynamic deberta_mrpc_compiled mingpt_largest; do
           run "$s" "scenarios/$s.yaml" --simulate-ranks 2 || { ok=1; break; }; done ;;
  *) echo "unknown part '$part'"; exit 2 ;;
esac
[ "$ok" = 0 ] && echo "$part: done" || echo "$part: not finished; call it again"
tar czf "$OUT/seed_runs.tgz" -C "$SEED" . 2>/dev/null  # whole run folders (logs, variant rows)
exit $ok
