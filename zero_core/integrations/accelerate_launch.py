"""`accelerate launch` with a DEEPSPEED config file, on zero_core, DeepSpeed not installed:

    python -m zero_core.integrations.accelerate_launch --config_file ds.yaml train.py ARGS   # was: accelerate launch

The arguments are `accelerate launch`'s, read by Accelerate's own parser and checks. Accelerate starts a DEEPSPEED
config's processes through DeepSpeed's launcher, and refuses to where DeepSpeed is missing; here they start as
Accelerate starts them on one machine with DeepSpeed (torchrun, with the `ACCELERATE_DEEPSPEED_*` variables
Accelerate exports from the config), each running the script under `python -m zero_core.deepspeed`. So a script
importing Accelerate's `Accelerator` trains on zero_core's DeepSpeed API, and one importing zero_core's
`Accelerator` reads the same variables. Every other config (multi-GPU, CPU, ...) launches as `accelerate launch`
does.
"""

from __future__ import annotations

import sys
from typing import Any

from accelerate.commands import launch as accelerate_launch
from accelerate.utils import patch_environment, prepare_deepspeed_cmd_env
from accelerate.utils.launch import _filter_args

SHIM = "zero_core.deepspeed"  # runs a script with `import deepspeed` answered by zero_core


def _launch_deepspeed_on_zero_core(args: Any) -> None:
    """Accelerate's single-machine DeepSpeed launch, each process's script run under the shim."""
    import torch.distributed.run as torchrun

    if args.num_machines > 1:
        raise ValueError(
            f"the config names {args.num_machines} machines and zero_core's accelerate launch starts one machine's "
            "processes; set num_machines: 1, or start each machine's with torchrun --nnodes --node-rank "
            "--master-addr -m zero_core.deepspeed train.py"
        )
    _, env = prepare_deepspeed_cmd_env(args)  # the ACCELERATE_DEEPSPEED_* variables, as Accelerate sets them
    if not args.module and not args.no_python:  # a script path: run it through the shim
        args.training_script_args = [args.training_script, *args.training_script_args]
        args.training_script, args.module = SHIM, True
    launch = _filter_args(args, torchrun.get_args_parser(), [
        "--training_script", args.training_script, "--training_script_args", args.training_script_args])
    with patch_environment(**env):
        torchrun.run(launch)


def main(argv: list[str] | None = None) -> int:
    args = accelerate_launch.launch_command_parser().parse_args(sys.argv[1:] if argv is None else argv)
    # Accelerate looks its launchers up in this module at the call; only this process's launch changes
    accelerate_launch.deepspeed_launcher = _launch_deepspeed_on_zero_core
    accelerate_launch.launch_command(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
