"""An Accelerate config's deepspeed_config_file is read like any DeepSpeed file: bad bytes and duplicate keys are
one ConfigError line that names the Accelerate key and the file."""

from __future__ import annotations

import pytest
import yaml

from zbench.accelerate_config import load_accelerate_config
from zero_core import ConfigError

ACCELERATE = {"distributed_type": "DEEPSPEED", "deepspeed_config": {"deepspeed_config_file": "ds.json"}}


@pytest.mark.parametrize(
    "content,expected",
    [
        (b"\xff\xfe{", "pass a readable UTF-8 JSON file"),
        (b'{"zero_optimization": {"stage": 2}, "zero_optimization": {"stage": 3}}', "twice in one object; keep one"),
    ],
)
def test_bad_deepspeed_config_file_is_one_line(tmp_path, content, expected):
    (tmp_path / "ds.json").write_bytes(content)
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(ACCELERATE))
    with pytest.raises(ConfigError) as info:
        load_accelerate_config(str(tmp_path / "a.yaml"))
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("accelerate_config: deepspeed_config_file: ") and expected in msg
    assert str(tmp_path / "ds.json") in msg
