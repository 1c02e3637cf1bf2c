"""Memory for model states per GPU and per CPU, per ZeRO stage and offload choice.

The formulas are DeepSpeed 0.19.8's estimators (deepspeed/runtime/zero/stage_1_and_2.py
`estimate_zero2_model_states_mem_needs`, stage3.py `estimate_zero3_model_states_mem_needs`), which count parameters,
gradients and Adam states with mixed precision (2 + 2 + 12 bytes per parameter, plus 4 bytes of fp32 gradients), and
a 1.5x buffer factor on the CPU side. DeepSpeed uses the stage-2 numbers for stage 1. `zbench estimate` prints them,
and `zero_core.deepspeed.runtime.zero` answers DeepSpeed's
`estimate_zero2/3_model_states_mem_needs_all_live/_all_cold` with them. Stage 0 (DDP-like) keeps everything on every
GPU: the stage-2 numbers for one GPU. DeepSpeed's estimators have no NVMe rows: those (`offload_optimizer=nvme`)
count zero_core's own buffers (`nvme_bytes`), and add the disk each rank needs. Activations and the CUDA context
come on top.
"""

from __future__ import annotations

from dataclasses import dataclass

BUFFER_FACTOR = 1.5  # DeepSpeed's additional_buffer_factor
# zero_core's NVMe chunk buffers per rank: buffer_count (4) x 3 fp32 states x NVME_CHUNK_NUMEL (4 Mi)
NVME_IO_BUFFER_BYTES = 4 * 3 * 4 * (4 << 20)
# zero_core's sharded initialisation per rank: up to two open 4 Mi-element fp32 assembly chunks
INIT_ASSEMBLY_BYTES = 2 * 4 * (4 << 20)


@dataclass(frozen=True)
class EstimateRow:
    stage: int
    offload_param: str
    offload_optimizer: str
    zero_init: bool | None  # stage 3 only: whether the model is built already partitioned
    cpu_bytes: int
    gpu_bytes: int
    disk_bytes: int = 0  # per GPU (rank): NVMe offload's state file


def zero2_bytes(total: int, gpus_per_node: int, nodes: int, cpu_offload: bool,
                buffer_factor: float = BUFFER_FACTOR) -> tuple[int, int]:
    """(cpu, gpu) bytes per process for stages 1 and 2: without offload every GPU holds the 16-bit weights and its
    share of 16-bit and fp32 gradients, fp32 weights and both moments (2 + 18 / GPUs bytes per parameter)."""
    total_gpus = gpus_per_node * nodes
    if cpu_offload:
        gpu = 2 * total
        cpu = total * max(4 * total_gpus, 16) * buffer_factor
    else:
        gpu = 2 * total + int(18 * total / total_gpus)
        cpu = total * 4 * gpus_per_node * buffer_factor
    return int(cpu), int(gpu)


def nvme_bytes(total: int, gpus_per_node: int, nodes: int) -> tuple[int, int]:
    """(host bytes per node, disk bytes per rank) of zero_core's NVMe optimizer offload, any stage 1-3.

    Per rank, in host memory: the pinned 16-bit gradient staging buffer and the 16-bit weight output
    (2 + 2 B per parameter of its partition; with offload_param the output is the host weight shard
    itself) and the I/O chunk buffers; on disk: fp32 master, exp_avg and exp_avg_sq (12 B per parameter
    of its partition). Gradient accumulation adds the fp32 gradient partition (4 B) in host memory.
    """
    part = -(-total // (gpus_per_node * nodes))
    return gpus_per_node * (4 * part + NVME_IO_BUFFER_BYTES), 12 * part


def zero3_bytes(
    total: int,
    largest: int,
    gpus_per_node: int,
    nodes: int,
    offload_optimizer: bool,
    offload_param: bool,
    zero_init: bool,
    buffer_factor: float = BUFFER_FACTOR,
) -> tuple[int, int]:
    """(cpu, gpu) bytes per process for stage 3."""
    total_gpus = gpus_per_node * nodes
    per_node = 1 / nodes
    largest_bytes = 4 * largest
    if offload_optimizer:
        factor = 18 if offload_param else 16
        gpu = largest_bytes if offload_param else largest_bytes + int(2 * total / total_gpus)
        if zero_init:
            cpu = total * factor * per_node * buffer_factor
        else:
            cpu = total * max(4 * gpus_per_node, factor * per_node) * buffer_factor
    else:
        gpu = largest_bytes + int(18 * total / total_gpus)
        cpu = largest * 4 * gpus_per_node * buffer_factor if zero_init else total * 4 * gpus_per_node * buffer_factor
    return int(cpu), int(gpu)


def estimate(total: int, largest: int, gpus_per_node: int = 1, nodes: int = 1,
             buffer_factor: float = BUFFER_FACTOR) -> list[EstimateRow]:
    """Every stage and offload choice, as DeepSpeed's `*_all_live` estimators list them."""
    rows = []
    gpu = zero2_bytes(total, 1, 1, False, buffer_factor)[1]  # nothing sharded: one GPU's worth on each
    cpu = zero2_bytes(total, gpus_per_node, nodes, False, buffer_factor)[0]
    rows.append(EstimateRow(0, "none", "none", None, cpu, gpu))
    host, disk = nvme_bytes(total, gpus_per_node, nodes)
    for stage in (1, 2):
        for offload in (True, False):
            cpu, gpu = zero2_bytes(total, gpus_per_node, nodes, offload, buffer_factor)
            rows.append(EstimateRow(stage, "none", "cpu" if offload else "none", None, cpu, gpu))
        rows.append(
            EstimateRow(stage, "none", "nvme", None, host, zero2_bytes(total, gpus_per_node, nodes, True)[1], disk)
        )
    for off_param, off_opt in ((True, True), (False, True), (False, False)):
        for zero_init in (True, False):
            cpu, gpu = zero3_bytes(total, largest, gpus_per_node, nodes, off_opt, off_param, zero_init, buffer_factor)
            rows.append(
                EstimateRow(3, "cpu" if off_param else "none", "cpu" if off_opt else "none", zero_init, cpu, gpu)
            )
    for off_param in (True, False):
        gpu = zero3_bytes(total, largest, gpus_per_node, nodes, True, off_param, True)[1]
        rows.append(EstimateRow(3, "cpu" if off_param else "none", "nvme", None, host, gpu, disk))
    return rows


def init_bytes(total: int, largest: int, gpus_per_node: int) -> tuple[int, int]:
    """(eager, sharded) host bytes per node while the model is initialised. Eager: every rank builds the
    whole fp32 model before `initialize` shards it. Sharded (zero_core.init_context at stage 3): each rank
    holds one layer's fp32 tensors while they are initialised and up to two assembly chunks of its shards;
    the shards themselves are the model states counted in the rows above."""
    return 4 * total * gpus_per_node, (4 * largest + INIT_ASSEMBLY_BYTES) * gpus_per_node


def format_init(total: int, largest: int, gpus_per_node: int) -> str:
    eager, sharded = init_bytes(total, largest, gpus_per_node)
    return (
        "Initialisation, host memory per node on top of the rows above (GiB):\n"
        f"| eager construction (every rank builds the fp32 model) | {eager / 2**30:.2f} |\n"
        "| zero_core.init_context / zero.Init, stage 3 (one layer + 2 assembly chunks per rank) "
        f"| {sharded / 2**30:.2f} |"
    )


def format_table(rows: list[EstimateRow], total: int, largest: int, gpus_per_node: int, nodes: int) -> str:
    """DeepSpeed's printout, extended with stages 0-2 and NVMe rows (GiB = 2**30 bytes; DeepSpeed writes "GB")."""
    lines = [
        "Estimated memory needed for params, optim states and gradients for a:",
        f"HW: Setup with {nodes} node{'s' if nodes > 1 else ''}, "
        f"{gpus_per_node} GPU{'s' if gpus_per_node > 1 else ''} per node.",
        f"SW: Model with {total / 1e6:.0f}M total params"
        + (f", {largest / 1e6:.0f}M largest layer params." if largest else "."),
        "",
        "| stage | per CPU (GiB) | per GPU (GiB) | disk per GPU (GiB) | options |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        opts = f"offload_param={r.offload_param}, offload_optimizer={r.offload_optimizer}"
        if r.zero_init is not None:
            opts += f", zero_init={int(r.zero_init)}"
        disk = f"{r.disk_bytes / 2**30:.2f}" if r.disk_bytes else "–"
        lines.append(f"| {r.stage} | {r.cpu_bytes / 2**30:.2f} | {r.gpu_bytes / 2**30:.2f} | {disk} | {opts} |")
    return "\n".join(lines)


def model_states_gib(
    stage: int,
    total: int,
    largest: int,
    gpus_per_node: int,
    nodes: int,
    offload_optimizer: bool = False,
    offload_param: bool = False,
) -> float:
    """The GPU estimate for one run's settings (for the measured-vs-estimated column)."""
    if stage == 0:
        gpu = zero2_bytes(total, 1, 1, False)[1]
    elif stage in (1, 2):
        gpu = zero2_bytes(total, gpus_per_node, nodes, offload_optimizer)[1]
    else:
        gpu = zero3_bytes(total, largest, gpus_per_node, nodes, offload_optimizer, offload_param, True)[1]
    return gpu / 2**30
