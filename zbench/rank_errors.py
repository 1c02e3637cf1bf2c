"""Which errors a rank records are about the user's input: those reach the terminal as their one line."""

from __future__ import annotations

# errors zbench and zero_core raise only for bad input, each message ending in its fix
INPUT_ERRORS = ("ConfigError", "UnsupportedFeature", "ScenarioError", "CheckpointError", "ZipCorrupt")


def input_problem(first: str) -> str | None:
    """The message of a rank's error about the user's input, from the first line of what the rank recorded
    (`<ExceptionName>: <message>`); None for anything else. Besides zbench's input errors, a ValueError
    worded as they are ("what is wrong; how to fix it") counts."""
    name, _, message = first.partition(": ")
    if name in INPUT_ERRORS or (name == "ValueError" and "; " in message):
        return message.strip()
    return None


def echo_log_lines(failure: Exception) -> str:
    """A failed rank (`launch.RankFailure`, whose text ends with the rank's last log lines): print those lines to
    stderr and give the failure's one line, saying where they are, for the one `Error:` line that ends the output."""
    import click

    problem, _, log_lines = str(failure).partition("\n")
    if not log_lines:
        return problem
    click.echo(log_lines, err=True)
    return f"{problem}; its last log lines are above"
