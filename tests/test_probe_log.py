"""zbench/probe_log.py: kept probe outcomes are used only under the same setup and when shaped as written."""

from __future__ import annotations

import json

from zbench.probe_log import ProbeLog

SETUP = {"ranks": 2, "simulated": False, "nodes": 1}
OOM = ("out of memory", "memory")


def _ran(log: ProbeLog, what: str, outcome: bool) -> tuple[bool, bool, int]:
    calls = []
    short_of, _, kept = log.probe(what, lambda: calls.append(what) or (None if outcome else OOM))
    return short_of is None, kept, len(calls)


def _resumed(tmp_path, what: str) -> tuple[str | None, str | None, bool]:
    """`what` as a resumed run reads it (a probe that is not kept fits)."""
    return ProbeLog(str(tmp_path), "v", SETUP, resume=True).probe(what, lambda: None)


def test_a_probe_runs_once_and_is_kept_for_a_resumed_run(tmp_path):
    (tmp_path / "variants").mkdir()
    first = ProbeLog(str(tmp_path), "v", SETUP, resume=False)
    assert _ran(first, "batch 8", False) == (False, False, 1)
    assert _ran(first, "batch 8", True) == (False, True, 0)  # asked again in the same run: not launched
    resumed = ProbeLog(str(tmp_path), "v", SETUP, resume=True)
    assert _ran(resumed, "batch 8", True) == (False, True, 0)
    assert _ran(resumed, "batch 4", True) == (True, False, 1)
    fresh = ProbeLog(str(tmp_path), "v", SETUP, resume=False)  # a new run trusts nothing it did not do
    assert _ran(fresh, "batch 8", True) == (True, False, 1)


def test_another_setup_or_a_foreign_file_is_not_used(tmp_path):
    (tmp_path / "variants").mkdir()
    path = tmp_path / "variants" / "v.probes.json"
    ProbeLog(str(tmp_path), "v", SETUP, resume=False).probe("batch 8", lambda: OOM)
    simulated = ProbeLog(str(tmp_path), "v", {**SETUP, "simulated": True}, resume=True)
    assert _ran(simulated, "batch 8", True) == (True, False, 1)
    for text in ("not json", json.dumps([1]), json.dumps({"setup": SETUP, "fits": {"batch 8": "yes"}})):
        path.write_text(text)
        assert _ran(ProbeLog(str(tmp_path), "v", SETUP, resume=True), "batch 8", True) == (True, False, 1)


def test_a_kept_probe_says_what_it_ran_out_of_and_its_kind(tmp_path):
    """An NVMe candidate too big for the disk is "out of disk space" of kind "disk space" when resumed too, not
    "out of memory": the kind is what names a row whose whole search failed on kept probes."""
    (tmp_path / "variants").mkdir()
    disk = ("out of disk space (needs 72 GB under /tmp/zb_nvme, 68 GB free)", "disk space")
    ProbeLog(str(tmp_path), "v", SETUP, resume=False).probe("n_layer=15, batch 1", lambda: disk)
    assert _resumed(tmp_path, "n_layer=15, batch 1") == (*disk, True)
    assert _resumed(tmp_path, "n_layer=14, batch 1") == (None, None, False)  # fits: of no kind
    path = tmp_path / "variants" / "v.probes.json"
    path.write_text(json.dumps({"setup": SETUP, "fits": {"batch 8": False}}))  # written before reasons were kept
    assert _resumed(tmp_path, "batch 8") == ("did not fit", None, True)
    # written before kinds were kept: the words still read, the kind is not known (the runner says OOM)
    path.write_text(json.dumps({"setup": SETUP, "fits": {"batch 8": False}, "why": {"batch 8": disk[0]}}))
    assert _resumed(tmp_path, "batch 8") == (disk[0], None, True)


def test_a_kept_reason_is_shown_escaped(tmp_path):
    """The reason comes from a file in the folder: printed raw, an ESC sequence or a newline in it would restyle
    the terminal or start a status line zbench did not write."""
    (tmp_path / "variants").mkdir()
    why = "\x1b[31mout of memory\nsecond line"
    path = tmp_path / "variants" / "v.probes.json"
    path.write_text(json.dumps({"setup": SETUP, "fits": {"batch 8": False}, "why": {"batch 8": why}}))
    assert _resumed(tmp_path, "batch 8")[0] == "\\x1b[31mout of memory\\nsecond line"
