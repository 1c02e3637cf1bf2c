#!/usr/bin/env bash
# zbench convert (verified, then --no-verify) against DeepSpeed's zero_to_fp32 on one DeepSpeed checkpoint,
# alternating, each run after dropping the checkpoint's pages (fsync + POSIX_FADV_DONTNEED: no privileges needed).
#   bash docs/benchmarks/scripts/cpu_convert.sh CKPT [ROUNDS]    # needs DS_PYTHON: a python with deepspeed
# Prints wall seconds and peak RSS per run (/usr/bin/time), then checks that the outputs hold the same tensors.
set -euo pipefail
ckpt=${1:?a DeepSpeed checkpoint folder (make_big_deepspeed_checkpoint.py makes one)}
rounds=${2:-5}
out=$(mktemp -d)
drop() { python3 - "$ckpt" <<'PY'
import os, pathlib, sys
for p in pathlib.Path(sys.argv[1]).rglob("*"):
    if p.is_file():
        fd = os.open(p, os.O_RDONLY); os.fsync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
PY
}
timed() { local label=$1; shift; /usr/bin/time -f "$label %e s %M KB" "$@" > /dev/null 2> "$out/err" \
  || { cat "$out/err"; exit 1; }; grep "^$label" "$out/err"; }
for _ in $(seq "$rounds"); do
  rm -rf "$out/zb" "$out/ds"; mkdir "$out/ds"
  drop; timed zbench-verified python3 -m zbench convert "$ckpt" --to fp32 --out "$out/zb"
  drop; DS_ACCELERATOR=cpu timed zero_to_fp32 "${DS_PYTHON:?}" "$ckpt/zero_to_fp32.py" "$ckpt" "$out/ds"
  rm -rf "$out/zb"; drop; timed zbench-no-verify python3 -m zbench convert "$ckpt" --to fp32 --out "$out/zb" --no-verify
done
python3 - "$out" <<'PY'
import pathlib, sys, torch
from safetensors.torch import load_file
out = pathlib.Path(sys.argv[1])
ours = load_file(out / "zb" / "model.safetensors")
theirs = {}
for f in sorted((out / "ds").glob("*.bin")) + sorted((out / "ds").glob("*.safetensors")):
    theirs.update(load_file(f) if f.suffix == ".safetensors" else torch.load(f, weights_only=True))
same = sum(torch.equal(t, theirs[n]) for n, t in ours.items() if n in theirs)
print(f"outputs: {same} of {len(ours)} stored tensors bitwise equal to zero_to_fp32's ({len(theirs)} keys there)")
PY
rm -rf "$out"
