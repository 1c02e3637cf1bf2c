#!/usr/bin/env bash
# Two commits on ONE machine: the same scenario run from each commit's own source tree, alternating A B A B ...,
# so that what drifts on the machine (host memory bandwidth, clocks, a neighbour) falls on both. Timings from
# two machines do not separate code from machine.
# Here, once per commit (.ab/ is git-ignored, so it travels only when carried):
#   mkdir -p .ab/a && git archive COMMIT_A zbench zero_core checkpoints scenarios pyproject.toml | tar x -C .ab/a
#   (the same for .ab/b), then a device call with carry [".whl", ".ab"] running, from the repo root:
#   bash docs/benchmarks/scripts/commit_ab.sh SCENARIO ROUNDS .ab/a .ab/b [zbench run args...]
# SCENARIO is a path from the repo root: both trees run that one file (and the configs beside it), so only the
# code differs; a tree's own scenarios/ may hold other settings of its day. gpt7b_offload is ~5 min a run on one
# H100, so 2 rounds (4 runs) go through detached.sh. Each run's results.json lands in $OUT/ab/; the last lines
# are one row per run (side A or B, round, step ms, TFLOP/s per GPU and the step-time breakdown).
# A_ENV / B_ENV (space-separated NAME=VALUE) set the environment of one side: with the same tree twice, an A/B of
# a setting, e.g. A_ENV=ZERO_CORE_HUGE_PAGES=0 B_ENV=ZERO_CORE_HUGE_PAGES=1 ... commit_ab.sh SCENARIO 2 . .
set -uo pipefail
scenario=$(realpath "${1:?a scenario path from the repo root}"); rounds=${2:?how many rounds}; a=${3:?tree A}; b=${4:?tree B}
shift 4
source docs/benchmarks/scripts/gpu_env.sh > "$OUT/env.txt" 2>&1; cat "$OUT/env.txt"
site=""; [ -d /tmp/site ] && [ -d .whl ] && site=/tmp/site:
mkdir -p "$OUT/ab"
[ -f "$scenario" ] || { echo "no scenario $scenario"; exit 2; }
for tree in "$a" "$b"; do
  [ -d "$tree/zbench" ] || { echo "$tree has no zbench/"; exit 2; }
done
for round in $(seq 1 "$rounds"); do
  for side in A B; do
    if [ "$side" = A ]; then tree=$a; side_env=${A_ENV:-}; else tree=$b; side_env=${B_ENV:-}; fi
    name="$side-$round"
    runs=$(mktemp -d /tmp/ab_runs.XXXXXX)
    echo "$name: zbench run $scenario $* (from $tree${side_env:+, with $side_env}), $(date -u +%T)"
    (cd "$tree" && PYTHONPATH="$site$PWD" python3 -c 'import zbench, zero_core; print("  imports", zbench.__file__, zero_core.__file__)')
    # shellcheck disable=SC2086  # side_env is a list of NAME=VALUE words
    (cd "$tree" && env $side_env PYTHONPATH="$site$PWD" python3 -m zbench.cli run "$scenario" --out "$runs" \
      --wandb off --no-progress "$@" > "$OUT/ab/$name.table.txt" 2> "$OUT/ab/$name.stderr.txt")
    echo "$name: rc $?"
    found=$(ls "$runs"/*/results.json 2>/dev/null | head -1)
    [ -n "$found" ] && cp "$found" "$OUT/ab/$name.json"
  done
done
python3 - "$OUT/ab" <<'EOF'
import glob, json, os, sys
from zero_core.step_timer import format_breakdown


def order(path):  # by round, then side: the order they ran in
    side, _, run = os.path.basename(path)[:-5].rpartition("-")
    return int(run), side


for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.json")), key=order):
    for row in json.load(open(path))["variants"]:
        if row.get("status") != "ok":
            print(os.path.basename(path)[:-5], row["variant"], row.get("status"), row.get("note", ""))
            continue
        parts = format_breakdown(row["breakdown"]) if row.get("breakdown") else ""
        print(os.path.basename(path)[:-5], row["variant"], f"{row['step_ms']:.1f} ms",
              f"{row.get('tflops_per_gpu') or 0:.1f} TFLOP/s", parts)
EOF
