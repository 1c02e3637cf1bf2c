"""`python -m zbench ...`: the same command line as the `zbench` script, every command registered."""

from .cli import main

main()
