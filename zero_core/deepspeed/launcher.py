"""DeepSpeed's launcher options on one node: `python -m zero_core.deepspeed --num_gpus 2 train.py ARGS` starts the
script on 2 local ranks, as `deepspeed --num_gpus 2 train.py ARGS` does.

Each rank is `python -m zero_core.deepspeed train.py --local_rank=N ARGS` (the argument DeepSpeed's launcher adds,
there, unless `--no_local_rank`), started by torch's elastic launcher (what torchrun runs), which also sets the rank
variables. `--include` / `--exclude` pick this host's devices (`localhost:0,2`) and become CUDA_VISIBLE_DEVICES,
as DeepSpeed's do. A launch across nodes (a hostfile, `--num_nodes` above 1, a node rank, ssh or a multi-node
backend) is refused in one line: run torchrun on each node instead, with `-m zero_core.deepspeed` and the script.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys

import torch

LOCAL_RANK_ARG = "ZERO_CORE_DS_LOCAL_RANK_ARG"  # set for the ranks: append --local_rank=N to the script's arguments
MODULE_ARG = "ZERO_CORE_DS_MODULE"  # set for the ranks: the script is a module name (DeepSpeed's --module)
_ACROSS_NODES = ("hostfile", "num_nodes", "node_rank", "no_ssh", "force_multi", "launcher", "launcher_args",
                 "ssh_port", "no_ssh_check", "venv_script")
_NOT_HERE = ("no_python", "autotuning", "bind_cores_to_rank", "bind_core_list", "elastic_training")
_LOCAL_NAMES = {"localhost", "127.0.0.1", socket.gethostname()}


class LaunchError(ValueError):
    """A launcher option this runner cannot honour, or a bad value: one line naming it and what to do."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print usage and exit 2; a one-line refusal instead
        if "required" in message:
            raise LaunchError("no training script: name it after the launcher options, then its arguments")
        raise LaunchError(f"{message}; see python -m zero_core.deepspeed --help")


def launcher_parser() -> argparse.ArgumentParser:
    """DeepSpeed's launcher's options (its names and defaults); the script and its arguments after them."""
    p = _Parser(prog="python -m zero_core.deepspeed", allow_abbrev=False, add_help=False)
    p.add_argument("--num_gpus", "--num_accelerators", type=int, default=-1)
    p.add_argument("-i", "--include", default="")
    p.add_argument("-e", "--exclude", default="")
    p.add_argument("--master_port", type=int, default=29500)
    p.add_argument("--master_addr", default="")
    p.add_argument("--module", action="store_true")
    p.add_argument("--no_local_rank", action="store_true")
    p.add_argument("--save_pid", action="store_true")  # accepted; no pid file is written
    p.add_argument("--enable_each_rank_log", default="None")  # accepted; each rank logs to this console
    p.add_argument("--log_level", default="info")
    p.add_argument("-q", "--quiet", action="store_true")
    p.add_argument("-H", "--hostfile", default=None)
    p.add_argument("--num_nodes", type=int, default=-1)
    p.add_argument("--node_rank", type=int, default=-1)
    for flag in ("--no_ssh", "--force_multi", "--no_ssh_check", "--no_python", "--bind_cores_to_rank",
                 "--elastic_training"):
        p.add_argument(flag, action="store_true")
    for opt in ("--launcher", "--launcher_args", "--ssh_port", "--venv_script", "--autotuning", "--bind_core_list"):
        p.add_argument(opt, default=None)
    p.add_argument("user_script")
    p.add_argument("user_args", nargs=argparse.REMAINDER)
    return p


def _refuse_unsupported(args: argparse.Namespace) -> None:
    defaults = launcher_parser().parse_args(["x"])
    for name in _ACROSS_NODES:
        if name == "num_nodes" and args.num_nodes in (-1, 1):
            continue
        if getattr(args, name) != getattr(defaults, name):
            raise LaunchError(f"--{name}: this runner launches on one node only; on several nodes run torchrun on "
                              "each (torchrun --nnodes N --node-rank R ... -m zero_core.deepspeed SCRIPT ARGS)")
    for name in _NOT_HERE:
        if getattr(args, name) != getattr(defaults, name):
            raise LaunchError(f"--{name} is not supported by python -m zero_core.deepspeed; leave it out")


def _slots(spec: str, flag: str) -> list[int] | None:
    """`localhost:0,2` -> [0, 2]; `localhost` -> None (every slot). Only this host may be named."""
    slots: list[int] | None = None
    for node in spec.split("@"):
        name, _, ids = node.partition(":")
        if name not in _LOCAL_NAMES:
            raise LaunchError(f"--{flag} names host {name!r}: this runner launches on this host only; name "
                              "localhost (e.g. localhost:0,1)")
        if ids:
            try:
                slots = (slots or []) + [int(i) for i in ids.split(",")]
            except ValueError:
                raise LaunchError(f"--{flag} {spec!r}: device ids must be integers, e.g. localhost:0,1") from None
    return slots


def devices(args: argparse.Namespace, available: int) -> list[int]:
    """This host's device ids the ranks use, one rank each, in order."""
    if args.include and args.exclude:
        raise LaunchError("--include and --exclude are mutually exclusive; pass one")
    ids = list(range(available))
    if args.include:
        chosen = _slots(args.include, "include")
        ids = ids if chosen is None else chosen
    elif args.exclude:
        dropped = _slots(args.exclude, "exclude")
        ids = [] if dropped is None else [i for i in ids if i not in dropped]
    bad = [i for i in ids if not 0 <= i < available]
    if bad:
        raise LaunchError(f"device ids {bad} are not on this host ({available} device(s)); name ids below {available}")
    if args.num_gpus == 0 or args.num_gpus < -1:
        raise LaunchError(f"--num_gpus {args.num_gpus}: pass a count of at least 1")
    if args.num_gpus > 0:
        if not args.include and not args.exclude and args.num_gpus > available:
            if available > 1 or torch.cuda.is_available():  # a CPU host: as many CPU ranks as asked
                raise LaunchError(f"--num_gpus {args.num_gpus}: this host has {available} device(s); pass at most "
                                  f"{available}")
            ids = list(range(args.num_gpus))
        ids = ids[: args.num_gpus]
    if not ids:
        raise LaunchError("no device left to launch on (--include/--exclude/--num_gpus); name at least one")
    return ids


def launch(argv: list[str]) -> int:
    """Parse DeepSpeed's launcher options, start the ranks, wait; the worst rank's exit status."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    args = launcher_parser().parse_args(argv)
    _refuse_unsupported(args)
    cuda = torch.cuda.is_available()
    ids = devices(args, torch.cuda.device_count() if cuda else 1)
    env_updates = {LOCAL_RANK_ARG: "0" if args.no_local_rank else "1", MODULE_ARG: "1" if args.module else "0"}
    if cuda:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        names = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
        env_updates["CUDA_VISIBLE_DEVICES"] = ",".join(names[i] for i in ids)
    os.environ.update(env_updates)  # the ranks inherit this process's environment
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=len(ids), run_id="zero_core_deepspeed",
                          rdzv_backend="static", rdzv_endpoint=f"{args.master_addr or '127.0.0.1'}:{args.master_port}",
                          rdzv_configs={"rank": 0}, max_restarts=0, monitor_interval=0.1)
    # the agent's own log lines (a rank's exit code, the signals it sends) would follow each rank's one-line error
    # (torch gives some of its loggers a level of their own, so each is set, not only the parent)
    for name in [n for n in logging.root.manager.loggerDict if n.startswith("torch.distributed.elastic")]:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        elastic_launch(config, sys.executable)("-m", "zero_core.deepspeed", args.user_script, *args.user_args)
    except ChildFailedError as failed:  # each rank printed its own error; the launcher adds no traceback
        return max((f.exitcode for f in failed.failures.values()), default=1) or 1
    return 0
