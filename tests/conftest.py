import os

# before anything imports triton: Triton kernels run on CPU. Not on a GPU run (ZB_TEST_DEVICE=cuda): there the
# interpreter would also take CUDA tensors, copying them through the host outside stream order (a false race
# with asynchronous collectives, and its own bf16 rounding), instead of testing the compiled kernels.
if os.environ.get("ZB_TEST_DEVICE") != "cuda":
    os.environ.setdefault("TRITON_INTERPRET", "1")


import pytest  # noqa: E402


@pytest.fixture
def backward_outlasts_host_folds(monkeypatch):
    """The host fold thread finishes every queued shard (and its speculative update) before backward ends, as on
    a GPU whose backward is long: on a loaded CPU runner it may otherwise reach them only after, when they are
    left to the step, and a test that needs updates started during backward would see none."""
    from zero_core.optim.host_adam import HostAdamW

    end_pass = HostAdamW.end_pass

    def waiting_end_pass(self):
        self._folder.wait()
        end_pass(self)

    monkeypatch.setattr(HostAdamW, "end_pass", waiting_end_pass)
