"""The import lines public DeepSpeed scripts and libraries use, under `import deepspeed` answered by zero_core
(alias.py): each line real DeepSpeed 0.19.8 imports either imports here too (and runs its one use), or, where
zero_core lacks the feature on purpose, fails in one line naming it and what to do, which the refusal hook prints
as its `Error:` line. The small helpers served at those paths give DeepSpeed's values
(tests/fixtures/deepspeed_import_paths.json, made by tests/fixtures/make_ds_import_paths.py)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from helpers import repo_pythonpath
from zero_core.refusal_hook import is_refusal

DEEPSPEED = json.loads((Path(__file__).parent / "fixtures" / "deepspeed_import_paths.json").read_text())


@pytest.fixture
def shim():
    """`deepspeed` answered by zero_core in this process for one test, then the import system as it was."""
    from zero_core.deepspeed import alias

    finders, modules = list(sys.meta_path), dict(sys.modules)
    alias.install()
    yield
    sys.meta_path[:] = finders
    for name in [n for n in sys.modules if n == "deepspeed" or n.startswith("deepspeed.")]:
        del sys.modules[name]
    sys.modules.update({n: m for n, m in modules.items() if n == "deepspeed" or n.startswith("deepspeed.")})


def _run(line: str) -> None:
    with redirect_stdout(io.StringIO()):  # see_memory_usage, logger lines
        exec(line, {})


@pytest.mark.parametrize("line", sorted(DEEPSPEED["provided"]))
def test_a_line_deepspeed_imports_imports_here(shim, line):
    assert DEEPSPEED["provided"][line] == "ok"
    _run(line)


@pytest.mark.parametrize("line", sorted(DEEPSPEED["refused"]))
def test_a_feature_zero_core_lacks_is_one_line_naming_it(shim, line):
    assert DEEPSPEED["refused"][line] == "ok"
    with pytest.raises(ModuleNotFoundError) as refused:
        _run(line)
    text = str(refused.value)
    assert "\n" not in text and " is not provided by zero_core: " in text, text  # why, and what to do instead
    assert text.split(" is not provided")[0].startswith("deepspeed.") and is_refusal(refused.value, refused.tb)


@pytest.mark.slow  # a subprocess under the shim
def test_an_uncaught_refusal_ends_an_unmodified_script_with_its_error_line(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3\n")
    env = {**os.environ, "PYTHONPATH": repo_pythonpath()}
    done = subprocess.run([sys.executable, "-m", "zero_core.deepspeed", str(script)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("Error: deepspeed.runtime.zero.stage3.DeepSpeedZeroOptimizer_Stage3 is not provided")


def test_the_helpers_give_deepspeeds_values(shim, tmp_path):
    from deepspeed import git_version_info
    from deepspeed.checkpoint import constants
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum
    from deepspeed.utils import instrument_w_nvtx
    from deepspeed.utils.logging import print_json_dist

    expected = DEEPSPEED["helpers"]
    ours = {k: v for k, v in vars(constants).items() if k.isupper() and not k.startswith("_")}
    assert ours.items() <= expected["constants"].items() and len(ours) >= 30
    members = [[name, m.value, m.name] for name, m in ZeroStageEnum.__members__.items()]
    assert members == expected["zero_stage_enum"] and (ZeroStageEnum.weights == 3) is True
    members = [[name, m.value, m.name] for name, m in OffloadDeviceEnum.__members__.items()]
    assert members == expected["offload_device_enum"] and (OffloadDeviceEnum.cpu == "cpu") is True
    version = [git_version_info.version.split("+")[0], git_version_info.git_hash, git_version_info.git_branch]
    assert version == expected["git_version_info"]
    message = {"loss": 1.5, "step": 3}
    print_json_dist(message, ranks=[0], path=str(tmp_path / "out.json"))
    assert (tmp_path / "out.json").read_text() == expected["print_json_dist_file"]
    assert message == expected["print_json_dist_message"]
    assert instrument_w_nvtx(lambda x, k=1: x * k)(2, k=3) == expected["instrumented_call"]


def test_a_converter_key_of_checkpoint_constants_is_refused_and_hasattr_still_answers(shim):
    from deepspeed.checkpoint import constants

    with pytest.raises(ModuleNotFoundError, match="zbench convert"):
        constants.AUTOEP_LAYERS_KEY  # noqa: B018
    assert not hasattr(constants, "lowercase_name") and not hasattr(constants, "__path__")
