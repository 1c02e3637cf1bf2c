"""`zbench bench checkpoint`: the command, its rich table and its markdown record
(measurements: bench_checkpoint.py)."""

from __future__ import annotations

import datetime
import os
import platform
from pathlib import Path

import click


def _rows(rows: list, info: dict) -> list[list[str]]:
    out = []
    for system, what, secs, nbytes in rows:
        rate = nbytes / secs / 1e9 if secs > 0 else float("inf")
        floor = info["read_gbs"] if "load" in what or "convert" in system else info["write_gbs"]
        blocked = "blocked" in what or not nbytes  # the time training waited (or buffers took), not an I/O rate
        out.append(
            [
                system,
                what,
                f"{nbytes / 1e9:.2f}" if nbytes else "-",
                f"{secs:.2f}",
                "-" if blocked else f"{rate:.2f}",
                "-" if blocked else f"{100 * rate / floor:.0f}%",
            ]
        )
    return out


HEADER = ["system", "operation", "GB", "seconds", "GB/s", "of disk floor"]
TITLE = "# Checkpoint I/O, one rank:"  # how a record starts: only a file that does is replaced by the next one
STATE_BYTES = 16  # per parameter held at once: fp32 weight, gradient and AdamW's two moments


def _checked_record(record: Path) -> Path:
    """The record's path, checked before the minutes of measuring: its folder exists, and a file already there
    is an earlier record (replaced), never another file of the user's."""
    if not record.parent.is_dir():
        raise click.ClickException(f"--record {record}: folder {record.parent} does not exist; create it or pass "
                                   "another --record")
    if record.exists() or record.is_symlink():
        earlier = False
        if record.is_file() and not record.is_symlink():  # never opened otherwise: a FIFO would block the read
            try:
                with open(record, encoding="utf-8", errors="replace") as f:
                    earlier = f.read(len(TITLE)) == TITLE
            except OSError:
                pass
        if not earlier:
            raise click.ClickException(f"--record {record} exists and is not an earlier checkpoint record; pass a "
                                       "new file name (it is never overwritten)")
    return record


def _checked_params(params: int, device_bytes: int) -> None:
    """One line when the model's training state cannot fit the memory it is built in (the run would swap or
    build layers for hours before failing)."""
    if params * STATE_BYTES > device_bytes:
        raise click.ClickException(
            f"--params {params:,} needs {params * STATE_BYTES / 1e9:,.1f} GB for its training state "
            f"({STATE_BYTES} bytes a parameter), more than the {device_bytes / 1e9:,.1f} GB here; pass a smaller "
            "--params"
        )


def markdown(rows: list, info: dict, command: str) -> str:
    lines = [
        f"{TITLE} zero_core beside DCP and DeepSpeed ({datetime.date.today()})",
        "",
        f"- Command: `{command}`",
        f"- Device: {info['device']}; host {platform.node()}, {platform.processor() or platform.machine()}",
        f"- torch {info['torch']}; model {info['params']:,} parameters (square Linear layers), one AdamW step",
        f"- Disk floor in {info['folder']} "
        f"({'O_DIRECT' if info['o_direct'] else 'buffered + fsync, O_DIRECT refused'}): "
        f"write {info['write_gbs']:.2f} GB/s, read {info['read_gbs']:.2f} GB/s",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
    ]
    lines += ["| " + " | ".join(r) + " |" for r in _rows(rows, info)]
    return "\n".join(lines) + "\n"


@click.command("checkpoint")
@click.option(
    "--params", default=None, type=click.IntRange(1), help="Model parameters (default: 770M on a GPU, 20M on the CPU)."
)
@click.option(
    "--dir",
    "folder",
    default=None,
    type=click.Path(file_okay=False, path_type=Path),
    help="Where to write the checkpoints (on the disk to measure; default: the temp folder).",
)
@click.option(
    "--record",
    default=None,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Markdown record to write (default: checkpoint_bench_<date>.md here).",
)
def bench_checkpoint_cmd(params: int | None, folder: Path | None, record: Path | None) -> None:
    """Save, async save, load and convert one rank's training state: zero_core, DCP and DeepSpeed (where
    installed), beside the disk's O_DIRECT write/read floor measured in the same run."""
    import sys

    import torch
    from rich.console import Console
    from rich.table import Table

    from .bench_checkpoint import run

    if folder is not None and not folder.is_dir():
        raise click.ClickException(f"--dir {folder} is not a folder; create it or pass another")
    record = _checked_record(record or Path(f"checkpoint_bench_{datetime.date.today()}.md"))
    cuda = torch.cuda.is_available()
    params = params or (770_000_000 if cuda else 20_000_000)
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    _checked_params(params, min(host, torch.cuda.get_device_properties(0).total_memory) if cuda else host)
    rows, info = run(params, folder)
    table = Table(title=f"checkpoint I/O, {info['params']:,} parameters on {info['device']}")
    for h in HEADER:
        table.add_column(h)
    for r in _rows(rows, info):
        table.add_row(*r)
    Console().print(table)
    click.echo(
        f"disk floor: write {info['write_gbs']:.2f} GB/s, read {info['read_gbs']:.2f} GB/s "
        f"({'O_DIRECT' if info['o_direct'] else 'buffered'})"
    )
    try:
        record.write_text(markdown(rows, info, "zbench " + " ".join(sys.argv[1:])), encoding="utf-8")
    except OSError as e:  # a full disk or a folder removed meanwhile: the table above is still printed
        raise click.ClickException(f"cannot write --record {record}: {e.strerror or e}; pass another --record")
    click.echo(f"record written to {record}")
