"""The reliability tables, counted from the battery's own case lists (so they cannot drift).

    python tests/reliability.py            # print both blocks
    python tests/reliability.py --write    # replace them: the summary row in README.md, the detailed
                                           # security and fault tables in docs/reliability.md

`test_reliability_table.py` fails when either file differs from what this prints, or when a test named
here no longer exists.
"""

from __future__ import annotations

import importlib
import math
import sys
from pathlib import Path

from helpers import REPO, TESTS, marked_block, rewrite_block

README = REPO / "README.md"
PAGE = REPO / "docs" / "reliability.md"
START, END = "<!-- reliability:start", "<!-- reliability:end -->"

# (fault injected, the test that injects it, what the test then checks; resumed = the run goes on from its
# last complete checkpoint, or that checkpoint is reloaded, and is compared with a run that had no fault)
FAULTS = [
    (
        "a rank fails as it starts (`zbench run`)",
        "test_runner_faults.py::test_rank_failure_is_one_error_after_the_ranks_last_lines",
        "the row fails, the other variants run, one error names the rank",
        False,
    ),
    (
        "out of memory during the batch search",
        "test_runner_faults.py::test_oom_is_a_row_and_the_batch_search_is_oom_safe",
        "OOM-safe search, an OOM row",
        False,
    ),
    (
        "a rank raises at step 10 of 16 (`zbench run`)",
        "test_runner_faults.py::test_killed_run_resumes_from_its_checkpoint_with_the_same_losses",
        "`--resume` from step 8: same loss curve (1e-6)",
        True,
    ),
    (
        "a rank SIGKILLed mid-step at step 130 of 240, and a NaN loss at step 50 (`zbench run`)",
        "test_long_run.py::test_long_run_killed_mid_step_resumes_bit_identical",
        "`--resume` from step 120: weights, moments, losses and skip count bit for bit",
        True,
    ),
    (
        "a rank killed mid-save",
        "test_checkpoint_resume.py::test_crash_mid_save_keeps_previous_checkpoint",
        "`latest` unchanged, the previous checkpoint loads bit for bit",
        True,
    ),
    (
        "a rank killed while a save replaces an existing tag",
        "test_checkpoint_safety.py::test_a_crash_while_replacing_a_tag_leaves_a_loadable_checkpoint",
        "the old copy of the tag loads bit for bit; the next save puts it back",
        True,
    ),
    (
        "a damaged checkpoint file (bit flip, truncation, deletion)",
        "test_checkpoint_resume.py::test_damaged_rank_file_is_named",
        "one error naming the file",
        False,
    ),
    (
        "a hung peer in a stage-3 all-gather",
        "test_faults.py::test_hung_peer_is_a_timeout_naming_the_rank_and_the_collective",
        "a CollectiveTimeout naming rank and collective within the timeout",
        False,
    ),
    (
        "a hung rank (`zbench run`)",
        "test_faults.py::test_zbench_run_reports_a_hung_rank_as_one_error",
        "one error line naming rank and collective",
        False,
    ),
    (
        "NaN and inf losses (bf16, fp16)",
        "test_faults.py::test_nonfinite_losses_are_skipped_and_counted",
        "skipped, counted, no weight changed",
        False,
    ),
    (
        "consecutive NaN losses (bf16, fp16)",
        "test_faults.py::test_consecutive_nonfinite_steps_stop_with_one_line",
        "stopped with one line, as configured",
        False,
    ),
    (
        "an inf gradient on one rank (fp16)",
        "test_engine_parity.py::test_fp16_overflow_skips_exactly_that_step",
        "every rank skips that step; loss scale halved",
        False,
    ),
    (
        "a full disk on one rank mid-save",
        "test_faults.py::test_disk_full_on_one_rank_keeps_the_previous_checkpoint",
        "one error on every rank, no debris, the previous checkpoint loads bit for bit",
        True,
    ),
    (
        "the kernel's file-size limit (EFBIG) mid-save",
        "test_faults.py::test_file_size_limit_from_the_os_while_saving",
        "as above, through safetensors' own writer",
        True,
    ),
    (
        "a full disk while converting",
        "test_faults.py::test_convert_to_a_full_disk_leaves_nothing",
        "one error line, nothing written",
        False,
    ),
    (
        "the kernel's file-size limit while converting",
        "test_faults.py::test_convert_under_an_os_file_size_limit_leaves_nothing",
        "one error line, nothing written",
        False,
    ),
    (
        "offload host memory that cannot be allocated",
        "test_offload_errors.py::test_unallocatable_host_buffer_is_one_clear_error",
        "one clear error at initialize",
        False,
    ),
]
# (attack, the tests that try it, what they check)
SECURITY = [
    (
        "code execution: a format-1 RNG state holding code, a DCP .metadata naming other classes",
        [
            "test_checkpoint_safety.py::test_code_in_a_format_1_rng_state_is_refused_and_never_run",
            "test_checkpoint_containment.py::test_metadata_naming_other_dcp_classes_is_refused",
            "test_checkpoint_safety.py::test_no_eval_exec_or_unrestricted_unpickling_in_the_tree",
            "test_yaml_strict.py::test_python_tags_binary_and_huge_files_are_refused",
        ],
        "refused with one line; nothing run; no eval, exec or unrestricted unpickling in the tree",
    ),
    (
        "path escapes: chunk paths, links, `latest` and `--tag`, run and variant names",
        [
            "test_checkpoint_containment.py::test_a_chunk_path_outside_the_folder_is_refused_before_any_read",
            "test_checkpoint_containment.py::test_a_link_inside_the_checkpoint_is_refused_unless_followed",
            "test_checkpoint_containment.py::test_a_link_inside_a_zbench_checkpoint_is_refused",
            "test_checkpoint_containment.py::test_a_pointer_file_must_name_a_tag_folder_inside",
            "test_checkpoint_containment.py::test_a_tag_must_be_a_plain_name",
            "test_convert_output.py::test_out_inside_the_source_is_refused",
            "test_checkpoint_safety.py::test_bad_tags_are_refused_before_writing",
            "test_input_bounds.py::test_names_refused",
            "test_input_bounds.py::test_run_paths_stay_inside_the_run_folder",
        ],
        "nothing outside the folder read or written; one line naming the path, the folder and the fix",
    ),
    (
        "races and crashes: two converts into one --out, a convert killed mid-way, a tag replaced during a crash, "
        "a checkpoint pruned while read, Ctrl-C and SIGTERM of `zbench run`",
        [
            "test_convert_output.py::test_two_converts_into_one_new_out_one_wins_and_its_output_survives",
            "test_convert_output.py::test_a_killed_convert_is_named_on_the_rerun_and_never_deleted_for_you",
            "test_convert_output.py::test_a_failed_convert_keeps_what_others_put_in_the_parents_it_made",
            "test_checkpoint_safety.py::test_a_crash_while_replacing_a_tag_leaves_a_loadable_checkpoint",
            "test_checkpoint_safety.py::test_a_checkpoint_removed_while_read_is_one_line",
            "test_interrupt.py::test_interrupted_run_stops_its_ranks_and_resumes",
        ],
        "no data lost: the winner's output, the old copy of the tag and the finished rows survive",
    ),
]
BAD_INPUT = [("test_bad_input_battery.py", "CASES"), ("test_bad_input_battery.py", "ENGINE_CASES")]
FUZZ = [
    "test_config_fuzz.py::test_fuzz_random_configs_only_raise_config_error",
    "test_config_fuzz.py::test_fuzz_mutated_seed_configs_only_raise_config_error",
    "test_manifest_fuzz.py::test_one_corrupted_value_anywhere",
    "test_manifest_fuzz.py::test_garbage_manifest",
]


def _function(ref: str):
    """The test function named `file.py::name` (imported the way pytest imports it: tests/ on sys.path)."""
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    file, _, name = ref.partition("::")
    module = importlib.import_module(Path(file).stem)
    fn = getattr(module, name, None)
    if fn is None:
        raise LookupError(f"{ref} does not exist; update tests/reliability.py")
    return fn


def cases(ref: str) -> int:
    """How many test cases `ref` runs: the product of its parametrize lists."""
    marks = getattr(_function(ref), "pytestmark", [])
    return math.prod(len(m.args[1]) for m in marks if m.name == "parametrize")


def examples(ref: str) -> int:
    """Hypothesis examples per run of a fuzz test (its max_examples)."""
    return _function(ref)._hypothesis_internal_use_settings.max_examples


def counts() -> dict[str, int]:
    bad = 0
    for file, name in BAD_INPUT:
        if str(TESTS) not in sys.path:
            sys.path.insert(0, str(TESTS))
        bad += len(getattr(importlib.import_module(Path(file).stem), name))
    return {
        "bad": bad,
        "fuzzed": sum(examples(r) for r in FUZZ),
        "faults": sum(cases(r) for _, r, _, _ in FAULTS),
        "security": sum(max(1, cases(r)) for _, refs, _ in SECURITY for r in refs),
        "resumed": sum(cases(r) for _, r, _, resumed in FAULTS if resumed),
    }


NOTE = "(printed by `python tests/reliability.py` from the battery's case lists; a test keeps it current) -->"


def summary() -> str:
    """README.md's block: one row of totals."""
    c = counts()
    return "\n".join(
        [
            f"{START} {NOTE}",
            "| inputs tried | attacks tried | faults injected | runs resumed | data lost |",
            "|---|---|---|---|---|",
            f"| {c['bad']} bad inputs + {c['fuzzed']} fuzzed configs and manifests | {c['security']} "
            f"| {c['faults']} | {c['resumed']} | 0 |",
            END,
        ]
    )


def details() -> str:
    """docs/reliability.md's block: the security and fault tables, one row per kind."""
    lines = [f"{START} {NOTE}", "| security: attack | cases | then |", "|---|---|---|"]
    for what, refs, then in SECURITY:
        lines.append(f"| {what} | {sum(max(1, cases(r)) for r in refs)} | {then} |")
    lines += ["", "| fault injected | cases | then | resumed |", "|---|---|---|---|"]
    for what, ref, then, resumed in FAULTS:
        lines.append(f"| {what} | {cases(ref)} | {then} | {'yes' if resumed else '–'} |")
    lines.append(END)
    return "\n".join(lines)


BLOCKS = {README: summary, PAGE: details}  # each file and the block it holds


def block_in(text: str) -> str | None:
    """The generated block of a file's text (None when it has none)."""
    return marked_block(text, START, END)


if __name__ == "__main__":
    for path, make in BLOCKS.items():
        new = make()
        if "--write" in sys.argv[1:]:
            rewrite_block(path, new, START, END)
        print(f"{path.relative_to(TESTS.parent)}:\n{new}\n")
