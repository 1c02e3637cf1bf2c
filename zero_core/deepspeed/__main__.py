"""Run a DeepSpeed training script unmodified on zero_core: its `import deepspeed` (and `from deepspeed.x import
y`) get zero_core.deepspeed.

    python -m zero_core.deepspeed train.py --deepspeed_config ds_config.json
    torchrun --nproc-per-node 2 -m zero_core.deepspeed train.py --deepspeed_config ds_config.json
    python -m zero_core.deepspeed --num_gpus 2 train.py --deepspeed_config ds_config.json   # as `deepspeed ...`

The script runs as `python train.py ...` would run it (its own arguments, its folder on sys.path). torchrun sets
the rank variables `deepspeed.init_distributed()` reads; it does not pass DeepSpeed's launcher's `--local_rank`.
Without torchrun the runner sets them for a world of one (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, a free
MASTER_PORT), as DeepSpeed's launcher does for one process: Hugging Face Trainer and Accelerate start their
process group from them. `importlib.metadata` finds a "deepspeed" distribution of the shim's version, so their
DeepSpeed version checks pass (package_metadata.py).
A refusal of the script's config or checkpoint that the script does not catch ends the run with its one line,
`Error: ...`, and exit status 1, instead of a traceback (zero_core/refusal_hook.py).
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

from checkpoints.paths import one_line as printable

from ..comm import free_port
from .alias import install
from .launcher import LOCAL_RANK_ARG, MODULE_ARG, LaunchError, launch

USAGE = ("usage: python -m zero_core.deepspeed [DEEPSPEED LAUNCHER OPTIONS: --num_gpus N, --include localhost:0,1, "
         "--exclude, --master_port, --master_addr, --module, --no_local_rank] SCRIPT [SCRIPT'S ARGUMENTS...]")


def _world_of_one_unless_launched() -> None:
    """A launcher's rank variables for one process, where no launcher set them."""
    if any(k in os.environ for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK")):
        return
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))  # not a fixed port: two runs on one host both start


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(USAGE + "\n" + __doc__.split("\n\n")[0], file=sys.stdout if args else sys.stderr)
        return 0 if args else 2
    if args[0].startswith("-"):  # DeepSpeed's launcher's options before the script: start its ranks
        return _launch(args)
    launched = LOCAL_RANK_ARG in os.environ  # a rank of that launcher, which reports an interrupt itself
    as_module = os.environ.pop(MODULE_ARG, "0") == "1"  # set by that launcher for its ranks
    if os.environ.pop(LOCAL_RANK_ARG, "0") == "1":
        # right after the script, before its own arguments, where DeepSpeed's launcher puts it (a script that reads
        # sys.argv[1] sees it there)
        args = [args[0], f"--local_rank={os.environ.get('LOCAL_RANK', '0')}", *args[1:]]
    script = Path(args[0])
    if not as_module and not script.is_file():
        print(f"Error: no script at {printable(str(script))}; name the training script to run, then its arguments",
              file=sys.stderr)
        return 2
    install()
    _world_of_one_unless_launched()
    try:
        _run_script(args, script, as_module)
    except KeyboardInterrupt:
        if not launched:
            raise  # alone, Ctrl-C ends the script as it would end `python train.py`
        return 130  # quietly: the launcher prints the one line for every rank it stopped
    return 0


def _run_script(args: list[str], script: Path, as_module: bool) -> None:
    if as_module:  # DeepSpeed's --module: the script is run as `python -m NAME` runs it
        sys.argv = [args[0], *args[1:]]
        sys.path.insert(0, os.getcwd())
        runpy.run_module(args[0], run_name="__main__", alter_sys=True)
        return
    sys.argv = [str(script), *args[1:]]
    sys.path.insert(0, str(script.resolve().parent))
    runpy.run_path(str(script), run_name="__main__")  # an uncaught refusal: its one line (refusal_hook.py)


def _launch(args: list[str]) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException

    try:
        return launch(args)
    except LaunchError as e:
        print(f"Error: {printable(str(e))}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, SignalException):  # the agent has stopped the ranks
        print("Error: interrupted; the ranks were stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
