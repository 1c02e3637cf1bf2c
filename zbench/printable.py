"""Text read from files or given on the command line, as zbench prints it: control characters escaped.

Methods, notes, probe outcomes and paths come from files anyone may have edited (results.json, a row, a
probe log) or from arguments. Printed raw, an escape sequence restyles the terminal, and a newline starts a
line zbench did not write (a second `Error:` line, a forged table row). Each character Python does not
call printable is written as a string literal writes it (`\\n`, `\\x1b`): the text stays on its line and
still says what it holds. A markdown cell also escapes `|`, which would end the cell.
"""

from __future__ import annotations


def printable(text: object) -> str:
    """`text` with every non-printable character (newline, ESC, other controls) written as its escape."""
    shown = str(text)
    if shown.isprintable():
        return shown
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in shown)


def markdown_cell(text: object) -> str:
    """`text` as one cell of a markdown pipe table."""
    return printable(text).replace("|", "\\|")
