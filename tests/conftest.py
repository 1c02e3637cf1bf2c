import os

# before anything imports triton: Triton kernels run on CPU. Not on a GPU run (ZB_TEST_DEVICE=cuda): there the
# interpreter would also take CUDA tensors, copying them through the host outside stream order (a false race
# with asynchronous collectives, and its own bf16 rounding), instead of testing the compiled kernels.
if os.environ.get("ZB_TEST_DEVICE") != "cuda":
    os.environ.setdefault("TRITON_INTERPRET", "1")
