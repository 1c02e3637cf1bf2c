# Sourced by the GPU scripts (`source docs/benchmarks/scripts/gpu_env.sh` from the repo root): NCCL multicast
# off (shared hosts), wheels in .whl/ installed to /tmp/site when present, the repo on PYTHONPATH, $OUT created,
# and the GPU, torch and triton versions printed for the benchmark file.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
