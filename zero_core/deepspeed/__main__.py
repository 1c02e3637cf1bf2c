"""Run a DeepSpeed training script unmodified on zero_core: its `import deepspeed` (and `from deepspeed.x import
y`) get zero_core.deepspeed.

    python -m zero_core.deepspeed train.py --deepspeed_config ds_config.json
    torchrun --nproc-per-node 2 -m zero_core.deepspeed train.py --deepspeed_config ds_config.json

The script runs as `python train.py ...` would run it (its own arguments, its folder on sys.path). torchrun sets
the rank variables `deepspeed.init_distributed()` reads; it does not pass DeepSpeed's launcher's `--local_rank`.
A refusal of the script's config or checkpoint that the script does not catch ends the run with its one line,
`Error: ...`, and exit status 1, instead of a traceback (zero_core/refusal_hook.py).
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

from .alias import install

USAGE = "usage: python -m zero_core.deepspeed SCRIPT [SCRIPT'S ARGUMENTS...]"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(USAGE + "\n" + __doc__.split("\n\n")[0], file=sys.stdout if args else sys.stderr)
        return 0 if args else 2
    script = Path(args[0])
    if not script.is_file():
        print(f"Error: no script at {script}; name the training script to run, then its arguments", file=sys.stderr)
        return 2
    install()
    sys.argv = [str(script), *args[1:]]
    sys.path.insert(0, str(script.resolve().parent))
    runpy.run_path(str(script), run_name="__main__")  # an uncaught refusal: its one line (refusal_hook.py)
    return 0


if __name__ == "__main__":
    sys.exit(main())
