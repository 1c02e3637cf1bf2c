"""The derived numbers against hand-computed values: memory estimates, FLOPs, metrics, the OOM-safe search."""

from __future__ import annotations

import math

import pytest

from helpers import cli, one_line_error
from zbench import metrics
from zero_core import memory_estimate as estimate
from zbench.search import largest_fitting, largest_fitting_value, train_stepping_down

GIB = 2**30
GPT2_XL = 1_557_611_200  # 50257*1600 + 1024*1600 + 48*(12*1600^2 + 13*1600) + 2*1600
GPT2_XL_LARGEST = 50257 * 1600  # the token embedding (tied head counted once)


def test_zero2_bytes_by_hand():
    p = 1_000_000_000
    assert estimate.zero2_bytes(p, 2, 1, cpu_offload=False) == (12 * p, 11 * p)  # cpu 4*2*1.5 p; gpu 2p + 18p/2
    assert estimate.zero2_bytes(p, 2, 1, cpu_offload=True) == (24 * p, 2 * p)  # cpu max(8, 16)*1.5 p; gpu 2p
    assert estimate.zero2_bytes(p, 8, 2, cpu_offload=True) == (96 * p, 2 * p)  # max(4*16, 16) * 1.5 = 96


def test_zero3_matches_deepspeeds_printed_table_for_t0_3b():
    """The seed doc's estimate_zero3_model_states_mem_needs_all_live output for bigscience/T0_3B on 1 GPU."""
    printed = {  # (offload_param, offload_optimizer, zero_init): (per CPU GB, per GPU GB) as DeepSpeed printed
        ("cpu", "cpu", True): (70.00, 0.25), ("cpu", "cpu", False): (70.00, 0.25),
        ("none", "cpu", True): (62.23, 5.43), ("none", "cpu", False): (62.23, 5.43),
        ("none", "none", True): (0.37, 46.91), ("none", "none", False): (15.56, 46.91),
    }
    rows = {(r.offload_param, r.offload_optimizer, r.zero_init): r
            for r in estimate.estimate(2_783_000_000, 65_000_000) if r.stage == 3}
    for key, (cpu, gpu) in printed.items():
        assert rows[key].cpu_bytes / GIB == pytest.approx(cpu, abs=0.05)  # the doc rounds the counts to 1M
        assert rows[key].gpu_bytes / GIB == pytest.approx(gpu, abs=0.05)


def test_gpt2_xl_counts_and_stage3_estimate_on_two_gpus():
    from zbench.models.configs import load_arch

    arch = load_arch("gpt2-xl", "scenarios")
    assert arch.config["n_layer"] == 48 and arch.config["n_embd"] == 1600
    cpu, gpu = estimate.zero3_bytes(GPT2_XL, GPT2_XL_LARGEST, 2, 1, offload_optimizer=False, offload_param=False,
                                    zero_init=True)
    assert gpu == 4 * GPT2_XL_LARGEST + 18 * GPT2_XL // 2 == 14_340_145_600
    assert cpu == int(GPT2_XL_LARGEST * 4 * 2 * 1.5)


def test_estimate_command_prints_the_table():
    result = cli("estimate", "--model", "zbench/model_configs/gpt2-xl.json", "--gpus", "2")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "SW: Model with 1558M total params, 80M largest layer params." in out
    assert "HW: Setup with 1 node, 2 GPUs per node." in out
    assert f"| 3 | {GPT2_XL_LARGEST * 4 * 2 * 1.5 / GIB:.2f} | {14_340_145_600 / GIB:.2f} |" in out
    stage0_gpu = (4 * GPT2_XL + 16 * GPT2_XL) / GIB
    assert f"| 0 | {GPT2_XL * 4 * 2 * 1.5 / GIB:.2f} | {stage0_gpu:.2f} |" in out
    one_line_error(cli("estimate", "--model", "nope"), alone=True)


def test_flops_per_token_and_tflops():
    assert metrics.flops_per_token(GPT2_XL, 48, 1600, 1024) == 6 * GPT2_XL + 12 * 48 * 1600 * 1024 == 10_289_385_600
    # README's zero_core stage-1 record: 82,625 tokens/s on 2 GPUs -> about 425 TFLOP/s per GPU
    assert metrics.tflops_per_gpu(82_625, 2, GPT2_XL, 48, 1600, 1024) == pytest.approx(
        82_625 / 2 * 10_289_385_600 / 1e12)


def test_task_metrics():
    assert metrics.f1_score(6, 2, 1) == pytest.approx(0.8)
    assert metrics.f1_score(0, 0, 0) == 0.0
    assert metrics.accuracy(3, 4) == 0.75 and math.isnan(metrics.accuracy(0, 0))
    assert metrics.perplexity(math.log(7.0)) == pytest.approx(7.0)
    assert metrics.loss_parity([1.0, 2.0, 3.0], [1.0, 2.5]) == 0.5


@pytest.mark.parametrize("limit", [1, 2, 3, 5, 8, 13, 100, 1000])
def test_batch_search_finds_the_boundary(limit):
    tried = []

    def fits(b: int) -> bool:
        tried.append(b)
        return b <= limit

    found = largest_fitting(fits, 1, 256)
    assert found == min(limit, 256)
    assert len(tried) <= 2 * math.ceil(math.log2(256)) + 2
    assert largest_fitting(lambda b: False, 4, 64) is None


def test_training_steps_down_from_the_searched_batch_a_bounded_number_of_times():
    tried = []

    def train(b: int) -> str | None:
        tried.append(b)
        return f"trained {b}" if b <= 53 else None

    assert train_stepping_down(train, 58, 1, 1, downs=3) == (55, None) and tried == [58, 57, 56, 55]
    tried.clear()
    assert train_stepping_down(train, 56, 1, 1, downs=3) == (53, "trained 53") and tried == [56, 55, 54, 53]
    tried.clear()
    assert train_stepping_down(train, 64, 48, 8, downs=3) == (48, "trained 48") and tried == [64, 56, 48]
    tried.clear()
    assert train_stepping_down(train, 60, 58, 1, downs=3) == (58, None) and tried == [60, 59, 58]  # not below start
    tried.clear()
    assert train_stepping_down(train, 2, 4, 1, downs=3) == (2, "trained 2") and tried == [2]  # a set batch under it
    assert train_stepping_down(lambda b: None, 9, 1) == (9, None)  # no step-downs: the batch alone


@pytest.mark.parametrize("limit", [3, 8, 13, 40, 47])
def test_batch_search_in_multiples(limit):
    tried = []

    def fits(b: int) -> bool:
        tried.append(b)
        return b <= limit

    assert largest_fitting(fits, 4, 128, multiple_of=8) == (limit // 8 * 8 or None)
    assert tried and all(b % 8 == 0 for b in tried)
    assert largest_fitting(lambda b: True, 1, 7, multiple_of=8) is None  # no multiple in range


def test_model_search_bisects_the_values():
    values = [1, 2, 4, 8, 16, 32]
    assert largest_fitting_value(lambda v: v <= 10, values) == 8
    assert largest_fitting_value(lambda v: True, values) == 32
    assert largest_fitting_value(lambda v: False, values) is None


def test_nvme_rows_count_zero_cores_buffers_and_the_disk():
    p = 1_000_000_000
    host, disk = estimate.nvme_bytes(p, 2, 1)
    assert disk == 12 * p // 2  # fp32 master + 2 moments of each rank's half
    assert host == 2 * (4 * p // 2 + estimate.NVME_IO_BUFFER_BYTES)  # 16-bit staging + output per rank, per node
    rows = [r for r in estimate.estimate(p, 10_000_000, 2, 1) if r.offload_optimizer == "nvme"]
    assert [(r.stage, r.offload_param) for r in rows] == [(1, "none"), (2, "none"), (3, "cpu"), (3, "none")]
    assert all(r.disk_bytes == disk and r.cpu_bytes == host for r in rows)
    assert rows[0].gpu_bytes == estimate.zero2_bytes(p, 2, 1, cpu_offload=True)[1]  # as CPU offload on the GPU
    table = estimate.format_table(estimate.estimate(p, 10_000_000, 2, 1), p, 10_000_000, 2, 1)
    assert f"| {disk / GIB:.2f} | offload_param=none, offload_optimizer=nvme |" in table


# DeepSpeed 0.19.8's own printout (DS_ACCELERATOR=cpu) of estimate_zero3/zero2_model_states_mem_needs_all_cold for
# GPT-2 XL's counts on 2 GPUs: (per CPU GB, per GPU GB) of each options row, in its order
DEEPSPEED_ZERO3 = [(39.17, 0.30), (39.17, 0.30), (34.82, 1.75), (34.82, 1.75), (0.90, 13.36), (17.41, 13.36)]
DEEPSPEED_ZERO2 = [(34.82, 2.90), (17.41, 15.96)]


def _printed_rows(out: str) -> list[tuple[float, float, str]]:
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| 2 ") or line.startswith("| 3 ")]
    return [(float(cpu), float(gpu), opts.strip()) for _, cpu, gpu, _, opts in rows]


def test_deepspeeds_estimators_print_deepspeeds_numbers(capsys):
    from zero_core.deepspeed.runtime.zero import stage3, stage_1_and_2

    stage3.estimate_zero3_model_states_mem_needs_all_cold(GPT2_XL, GPT2_XL_LARGEST, num_gpus_per_node=2)
    rows = _printed_rows(capsys.readouterr().out)
    assert [(c, g) for c, g, o in rows if "nvme" not in o] == DEEPSPEED_ZERO3
    stage_1_and_2.estimate_zero2_model_states_mem_needs_all_cold(GPT2_XL, num_gpus_per_node=2)
    rows = _printed_rows(capsys.readouterr().out)
    assert [(c, g) for c, g, o in rows if "nvme" not in o] == DEEPSPEED_ZERO2
    assert stage_1_and_2.estimate_zero2_model_states_mem_needs(GPT2_XL, 2, cpu_offload=False) == (
        int(GPT2_XL * 4 * 2 * 1.5), 2 * GPT2_XL + int(18 * GPT2_XL / 2))


def test_all_live_counts_tied_weights_once_and_the_largest_module(capsys):
    from parity_workers import make_model

    from zero_core.deepspeed.runtime.zero.estimators import model_counts
    from zero_core.deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs_all_live

    model = make_model()
    total, largest = model_counts(model)
    assert total == sum(p.numel() for p in model.parameters())  # the tied head is one parameter
    fc = model.blocks[0].mlp.fc  # the widest Linear: its weight and bias are the most one module holds itself
    assert largest == fc.weight.numel() + fc.bias.numel() > model.wte.weight.numel()
    estimate_zero3_model_states_mem_needs_all_live(model, num_gpus_per_node=4, additional_buffer_factor=1.0)
    rows = _printed_rows(capsys.readouterr().out)
    want = estimate.zero3_bytes(total, largest, 4, 1, True, True, True, buffer_factor=1.0)
    assert rows[0][:2] == (round(want[0] / GIB, 2), round(want[1] / GIB, 2))
    with pytest.raises(ValueError, match="num_gpus_per_node must be a whole number >= 1"):
        estimate_zero3_model_states_mem_needs_all_live(model, num_gpus_per_node=0)
