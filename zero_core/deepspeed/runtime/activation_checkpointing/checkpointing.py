"""`deepspeed.runtime.activation_checkpointing.checkpointing`: the module `deepspeed.checkpointing` names, under
the path DeepSpeed defines it at (scripts import either); it is that same module."""

import sys

from ... import checkpointing

sys.modules[__name__] = checkpointing
