"""The table as a person reads it in a terminal: at most 120 columns wide, drawn by rich.

The full table (every column, every row) stays in table.md and results.csv. Here, columns whose cell is
the same in every row (model, data, a batch size set for all, an unmeasured GPU memory on a CPU run) move
into the table's caption as "name: value". When the rest is still wider than the console, the free-text
columns (method, notes, then parity) move under the table one at a time, as "Name: variant: text; ...", so
that no number is ever folded across lines; rich wraps headers at words and the lines under the table to
the console width, itself at most 120 columns.
"""

from __future__ import annotations

import sys
from typing import IO, Any

from .results import caption, footer, table_rows

MAX_WIDTH = 120
ALWAYS_SHOWN = ("Variant",)
UNBROKEN = ("Variant", "Loss parity vs DDP")  # short labels that read wrong when broken
# free text that moves under the table, in this order, while the table is wider than the console
MOVABLE = ("Method", "Notes", "Loss parity vs DDP")
LEGEND = {"Method": "Methods", "Loss parity vs DDP": "Parity vs DDP"}
# terminal headers (table.md keeps the articles' long ones)
SHORT = {
    "Batch size (max)": "Batch",
    "Eval size (max)": "Eval batch",
    "Train time per epoch (s)": "Train s/epoch",
    "Eval time per epoch (s)": "Eval s/epoch",
    "Step vs floor": "vs floor",
    "TFLOP/s per GPU": "TFLOP/s /GPU",
    "Peak GPU GiB": "GPU GiB",
    "Peak CPU GiB": "CPU RSS GiB",
    "Loss parity vs DDP": "Parity vs DDP",
}


def split_constant(header: list[str], rows: list[list[str]]) -> tuple[list[int], list[tuple[str, str]]]:
    """(indices of the columns that vary, [(header, value)] of those equal in every row); with one row nothing
    is constant, so the row reads as a table."""
    varying, constant = [], []
    for i, name in enumerate(header):
        values = {r[i] for r in rows}
        if len(rows) > 1 and len(values) == 1 and name not in ALWAYS_SHOWN:
            value = values.pop()
            constant += [(name, value)] if value else []  # an empty Notes column just goes
        else:
            varying.append(i)
    return varying, constant


def _fixed_width(name: str, cells: list[str]) -> int | None:
    """The width of a column that must not break (numbers, variant names), None for free text."""
    numeric = all(c[:1].isdigit() or c == "–" for c in cells)
    if not numeric and name not in UNBROKEN:
        return None
    return max([*(len(c) for c in cells), *(len(word) for word in SHORT.get(name, name).split())])


def _needed(header: list[str], rows: list[list[str]], columns: list[int]) -> int:
    """About how wide the table is with `columns`: fixed widths, 14 for free text, 2 between columns."""
    return sum(_fixed_width(header[i], [r[i] for r in rows]) or 14 for i in columns) + 2 * (len(columns) - 1)


def fit(header: list[str], rows: list[list[str]], varying: list[int], width: int) -> tuple[list[int], list[str]]:
    """(the columns left in the table, the lines under it): free-text columns leave the table, in MOVABLE's
    order, while it is wider than `width`; each becomes one line naming each row's text (empty cells left out)."""
    varying, legends = list(varying), []

    def move(i: int) -> None:
        varying.remove(i)
        texts = [f"{r[0]}: {r[i]}" for r in rows if r[i] not in ("", "–")]
        if texts:
            legends.append(f"{LEGEND.get(header[i], header[i])}: " + "; ".join(texts))

    for name in MOVABLE:
        if _needed(header, rows, varying) <= width:
            break
        if name in header and header.index(name) in varying:
            move(header.index(name))
    # still wider than the table may run (MAX_WIDTH, past a narrower terminal: see print_table), as one row with
    # no column constant can be: rather than let rich crop the last columns, the other free text leaves, then
    # the columns from the right, each as its own line
    while _needed(header, rows, varying) > max(width, MAX_WIDTH) and len(varying) > 1:
        free = [i for i in varying[1:] if _fixed_width(header[i], [r[i] for r in rows]) is None]
        move(free[-1] if free else varying[-1])
    return varying, legends


def width_for(stream: IO[str]) -> int:
    """The terminal's width (COLUMNS where set, 80 for a pipe, as rich decides), never above MAX_WIDTH."""
    from rich.console import Console

    return min(MAX_WIDTH, Console(file=stream).width)


def print_table(summary: dict[str, Any], stream: IO[str] | None = None, width: int | None = None) -> None:
    """Print the run's table, its caption and the step-time breakdown to `stream` (stdout)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    stream = stream or sys.stdout
    console = Console(
        file=stream, width=width or width_for(stream), soft_wrap=False, highlight=False, emoji=False, markup=False
    )
    header, rows = table_rows(summary)
    varying, constant = split_constant(header, rows)
    varying, legends = fit(header, rows, varying, console.width)
    # a narrow terminal or a pipe (80 columns by rich's rule) would fold every number into a column of digits:
    # the table may run past it, up to MAX_WIDTH
    console.width = min(MAX_WIDTH, max(console.width, _needed(header, rows, varying)))
    same = "; ".join(f"{name}: {value}" for name, value in constant)
    table = Table(
        box=box.SIMPLE_HEAD,
        caption=f"In every row: {same}" if same else None,
        caption_justify="left",
        pad_edge=False,
        show_edge=False,
        collapse_padding=True,
    )
    for i in varying:
        cells = [r[i] for r in rows]
        name = SHORT.get(header[i], header[i])
        fixed = _fixed_width(header[i], cells)
        # numbers and names never break (headers wrap at words above them); method and notes wrap at words
        table.add_column(
            name,
            justify="right" if fixed and header[i] not in UNBROKEN else "left",
            overflow="fold",
            width=fixed,
            min_width=None if fixed else min(max((len(c) for c in cells), default=0), 14),
        )
    for r in rows:
        table.add_row(*(r[i] for i in varying))
    console.print(table)
    for line in legends:
        console.print(line)
    console.print(caption(summary))
    rest = footer(summary)
    if rest:
        console.print(rest.rstrip("\n"))
    stream.flush()
