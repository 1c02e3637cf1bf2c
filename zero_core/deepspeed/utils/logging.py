"""`deepspeed.utils.logger` and `log_dist`: messages prefixed with the rank, logged where the caller asks.

Without a process group every call logs; with one, only ranks listed in `ranks` do (`[-1]`: every rank), so
`log_dist(msg)` with no ranks is silent on a multi-rank run, as in DeepSpeed."""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

import torch.distributed as dist

logger = logging.getLogger("zero_core.deepspeed")
if not logger.handlers:  # scripts expect DeepSpeed's logger to print INFO without configuring logging
    _handler = logging.StreamHandler(sys.stdout)
    _handler.setFormatter(logging.Formatter("[%(asctime)s] [%(levelname)s] %(message)s"))
    logger.addHandler(_handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def dist_message(message: str, ranks: list[int] | None = None) -> str | None:
    """`message` with this rank's prefix where it should be logged, else None."""
    if not dist.is_initialized():
        return f"[Rank -1] {message}"
    rank = dist.get_rank()
    wanted = list(ranks or [])
    return f"[Rank {rank}] {message}" if wanted and (wanted[0] == -1 or rank in wanted) else None


def log_dist(message: str, ranks: list[int] | None = None, level: int = logging.INFO) -> None:
    text = dist_message(message, ranks)
    if text is not None:
        logger.log(level, text)


def print_dist(message: str, ranks: list[int] | None = None) -> None:
    text = dist_message(message, ranks)
    if text is not None:
        print(text, flush=True)


def print_json_dist(message: dict[str, Any], ranks: list[int] | None = None, path: str | None = None) -> None:
    """Where `log_dist` would log: `message`, with this rank added under "rank" (-1 without a process group), written
    as JSON to `path` and synced to disk."""
    if dist_message("", ranks) is None:
        return
    message["rank"] = dist.get_rank() if dist.is_initialized() else -1
    assert path is not None, "print_json_dist needs the path of the file to write"
    with open(path, "w") as out:
        json.dump(message, out)
        out.flush()
        os.fsync(out.fileno())
