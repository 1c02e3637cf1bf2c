"""A click group whose commands are imported when they run, so `zbench --help` loads no torch, and whose
commands' errors are each printed on one line (control characters in the paths they name escaped; Ctrl-C
is one line too).

Each lazy command is (module, attribute, one-line help); the listing of `zbench --help` prints that line
without importing the module (a test keeps each line equal to the command's own docstring summary).
"""

from __future__ import annotations

import importlib
import signal
from typing import Any

import click

from .printable import printable


def _one_line(e: click.UsageError) -> click.ClickException:
    """A usage error as one `Error:` line naming the fix (click prints the usage block and a hint above it)."""
    where = " ".join(["zbench", *(e.ctx.command_path.split()[1:] if e.ctx is not None else [])])  # as installed
    one = click.ClickException(f"{printable(e.format_message()).rstrip('.')}; see '{where} --help'")
    one.exit_code = e.exit_code
    return one


FINISHED = "zbench.finished"  # ctx.meta key: what a command has published in full (a Ctrl-C after it loses nothing)


class LazyGroup(click.Group):
    def __init__(self, *args: Any, lazy: dict[str, tuple[str, str, str]] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy or {}

    # a bad option or argument of the group or of any of its commands: one line, as every other error
    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except click.UsageError as e:
            raise _one_line(e) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as e:
            raise _one_line(e) from None
        except click.ClickException as e:  # a path or name with a newline or ESC in it stays on the one line
            e.message = printable(e.message)
            raise
        except KeyboardInterrupt:  # Ctrl-C: one line instead of click's "Aborted!" (what was being written is removed)
            where = " ".join(["zbench", *ctx.command_path.split()[1:], ctx.invoked_subcommand or ""]).strip()
            done = ctx.meta.get(FINISHED)  # what the command had published before the interrupt came
            stopped = click.ClickException(f"interrupted (Ctrl-C) after {where} finished: {done}; nothing to redo"
                                           if done else f"interrupted (Ctrl-C); {where} stopped before it finished; "
                                           "run it again")
            stopped.exit_code = 128 + signal.SIGINT
            raise stopped from None

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.lazy])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy:
            module, attribute, _ = self.lazy[name]
            return getattr(importlib.import_module(module), attribute)
        return super().get_command(ctx, name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            if name in self.lazy:  # shortened as click shortens a command's own help
                rows.append((name, click.Command(name, help=self.lazy[name][2]).get_short_help_str(
                    formatter.width - 6 - len(name))))
            else:
                cmd = super().get_command(ctx, name)
                if cmd is not None and not cmd.hidden:
                    rows.append((name, cmd.get_short_help_str(formatter.width - 6 - len(name))))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)
