"""The printed table of a wide run (seventeen columns, long notes): it fits 120 columns without folding a
number, and the free text that leaves the table is printed whole under it.

The fixture is the results.json of `zbench run scenarios/deberta_mrpc.yaml --simulate-ranks 2` on one H100
(losses trimmed): a searched batch "16 (step 8)", a skipped DeepSpeed row, notes and parity text per row.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from zbench.results import table_rows
from zbench.terminal_table import MAX_WIDTH, fit, print_table, split_constant

SUMMARY = json.loads((Path(__file__).parent / "fixtures" / "results_simulated_fp16.json").read_text())


def _printed(width: int) -> list[str]:
    out = io.StringIO()
    print_table(SUMMARY, stream=out, width=width)
    return out.getvalue().splitlines()


@pytest.mark.parametrize("width", [80, 120])
def test_every_row_keeps_its_numbers_whole_on_one_line(width):
    lines = _printed(width)
    assert max(len(line) for line in lines) <= MAX_WIDTH
    header, rows = table_rows(SUMMARY)
    shown, _ = fit(header, rows, split_constant(header, rows)[0], MAX_WIDTH)
    checked = 0
    for row in rows:
        line = next(line for line in lines if line.split() and line.split()[0] == row[0])
        for cell in (row[i] for i in shown if row[i][:1].isdigit()):
            assert f" {cell} " in f" {line} ", (cell, line)
            checked += 1
    assert checked == 2 * 11  # two measured rows of eleven numbers (the skipped DeepSpeed row has none)


def test_the_free_text_moves_under_the_table_whole():
    text = " ".join(" ".join(_printed(120)).split())
    header, rows = table_rows(SUMMARY)
    notes = {r[0]: r[header.index("Notes")] for r in rows}
    assert notes["ds-zero2"] == "simulated ranks: DeepSpeed's communication needs real peers"
    assert "Notes: ddp: 2 step(s) skipped (non-finite gradients); ds-zero2: " + notes["ds-zero2"] in text
    assert "Methods: ddp: DDP (torch DistributedDataParallel); zero2: zero_core ZeRO Stage 2" in text
    table_head = next(line for line in _printed(120) if line.startswith("Variant"))
    assert "Notes" not in table_head and "Method" not in table_head


def test_free_text_stays_in_the_table_when_it_fits():
    header = ["Variant", "Method", "Tokens/s", "Notes"]
    rows = [["ddp", "DDP", "1,000", "short"], ["zero2", "ZeRO 2", "2,000", ""]]
    assert fit(header, rows, [0, 1, 2, 3], 120) == ([0, 1, 2, 3], [])
    kept, legends = fit(header, rows, [0, 1, 2, 3], 20)  # the method leaves first, then the notes
    assert kept == [0, 2] and legends == ["Methods: ddp: DDP; zero2: ZeRO 2", "Notes: ddp: short"]


def test_a_row_whose_steps_were_mostly_skipped_says_its_time_is_no_training_speed():
    summary = json.loads(json.dumps(SUMMARY))
    ddp = next(r for r in summary["variants"] if r["variant"] == "ddp")
    ddp.update(skipped_steps=30, skipped_by_step=[0, 0, *range(1, 31)])
    header, rows = table_rows(summary)
    note = next(r for r in rows if r[0] == "ddp")[header.index("Notes")]
    assert note == ("30 of 32 steps skipped (non-finite gradients): no update ran in them, so the step time is not "
                    "a training speed")
    ddp.update(skipped_steps=2, skipped_by_step=[1, 2, *[2] * 30])  # a loss scale settling: the usual note
    header, rows = table_rows(summary)
    assert next(r for r in rows if r[0] == "ddp")[header.index("Notes")] == "2 step(s) skipped (non-finite gradients)"


def test_a_one_row_table_too_wide_for_the_terminal_moves_columns_under_it_instead_of_cropping_them():
    """One row has no column equal in every row to move to the caption: a long variant name and wide numbers
    used to push the last columns (the memory, in a memory scenario) off the printed table."""
    one = {**SUMMARY, "variants": [dict(SUMMARY["variants"][0], variant="zero3-offload-nvme-with-a-long-name",
                                        step_ms=50035.9, train_s_per_epoch=1601.15, peak_cpu_gib=20.31)]}
    out = io.StringIO()
    print_table(one, stream=out, width=120)
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= MAX_WIDTH
    header, rows = table_rows(one)
    text = " ".join(" ".join(lines).split())
    for name, cell in zip(header, rows[0]):
        if cell not in ("", "–"):
            assert cell in text, (name, cell)  # in the table or on a line under it, whole
