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
