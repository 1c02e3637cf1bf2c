import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton: Triton kernels run on CPU
