"""offload_param.device: nvme: the 16-bit weight partition is a file mapping under nvme_path; training is
bitwise the same as with the partition in host memory."""

from __future__ import annotations

import os

import torch

from dist_harness import run_ranks
from init_workers import param_offload_losses
import pytest

pytestmark = pytest.mark.slow  # spawned ranks or whole runs: outside the fast tier (-m 'not slow')


def test_nvme_parameters_train_as_host_parameters(tmp_path):
    host = run_ranks(param_offload_losses, 2, "cpu", str(tmp_path))
    nvme = run_ranks(param_offload_losses, 2, "nvme", str(tmp_path))
    assert nvme["losses"] == host["losses"]
    assert all(torch.equal(nvme["state"][k], v) for k, v in host["state"].items())
    assert str(tmp_path) in nvme["mapped"]  # the partition really was the file mapping
    assert os.listdir(tmp_path) == []  # the file had no name once mapped: nothing left behind
