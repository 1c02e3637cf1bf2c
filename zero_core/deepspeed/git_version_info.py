"""`deepspeed.git_version_info`: the version fields a pip-installed DeepSpeed reports, for scripts that log them.
Its op lists are left out: zero_core builds none of DeepSpeed's ops (its kernels are its own)."""

from __future__ import annotations

from . import __version__

version = __version__
git_hash = git_branch = "unknown"  # what a pip-installed DeepSpeed 0.19.8 reports
