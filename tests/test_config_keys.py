"""Every DeepSpeed key zero_core knows is supported, ignored (and named once by rank 0) or refused; the docs say the
same."""

from __future__ import annotations

import json

import config_table
import pytest
from pydantic import BaseModel

from zero_core import ConfigError, load_config
from zero_core import config as config_module
from zero_core.config_errors import _section_model
from zero_core.config_keys import (
    ALIASES,
    BY_PATH,
    IGNORED,
    KEYS,
    LOGGING_SECTIONS,
    REFUSED,
    SUPPORTED,
    refused_outright,
)
from zero_core.config_models import ZeroConfig

MB = {"train_micro_batch_size_per_gpu": 2}


def _fields(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Dotted paths of every leaf field of the config models (a logging section is one leaf)."""
    out = []
    for name, field in model.model_fields.items():
        sub = _section_model(field.annotation)
        out += _fields(sub, f"{prefix}{name}.") if sub is not None else [prefix + name]
    return out


FIELDS = _fields(ZeroConfig)


def test_every_model_field_has_a_row():
    missing = [path for path in FIELDS if path not in BY_PATH]
    assert not missing, f"add these keys to zero_core/config_keys.py: {missing}"


def test_every_row_is_a_field_or_a_key_refused_outright():
    assert {k.status for k in KEYS} == {SUPPORTED, IGNORED, REFUSED}
    extra = [k.path for k in KEYS if k.path not in FIELDS]
    assert sorted(extra) == sorted(refused_outright())
    assert all(k.why for k in KEYS if k.status != SUPPORTED)
    assert all(new in FIELDS or new == "bf16" for new in ALIASES.values())


def _set(config: dict, path: str, value: object) -> None:
    *parents, name = path.split(".")
    for part in parents:
        config = config.setdefault(part, {})
    config[name] = value


def _valid_value(path: str) -> object:
    """A value zero_core accepts for the key: its model default, or what a refused key accepts."""
    row = BY_PATH[path]
    if row.switch:  # a section, accepted while off
        return {row.switch: row.accepts[0]}
    if row.accepts:
        return row.accepts[0]
    model, *parts = ZeroConfig, *path.split(".")
    for part in parts[:-1]:
        model = _section_model(model.model_fields[part].annotation)
    default = model.model_fields[parts[-1]].default
    return {} if default is None and path in LOGGING_SECTIONS else default


@pytest.fixture
def named(monkeypatch, capsys):
    """The rank-0 lines load_config prints (a fresh process's worth)."""
    monkeypatch.setattr(config_module, "_NAMED", set())

    def lines() -> list[str]:
        return [line for line in capsys.readouterr().err.splitlines() if line.startswith("zero_core: accepted")]

    return lines


def test_the_line_names_exactly_the_ignored_keys_a_config_sets(named):
    quiet = [k.path for k in KEYS if k.status != SUPPORTED and k.path in FIELDS]
    config = {**MB, "zero_optimization": {"stage": 3}, "optimizer": {"type": "AdamW", "params": {"lr": 0.1}}}
    for path in quiet:
        _set(config, path, _valid_value(path))
    load_config(config, 1)
    [line] = named()
    listed = line.removeprefix("zero_core: accepted, not acted on: ")
    assert [entry.split(" (")[0] for entry in listed.split("), ")] == quiet
    assert "zero_optimization.allgather_bucket_size (all-gathers use the reduce buckets)" in line


def test_a_config_of_supported_keys_names_nothing_and_the_line_comes_once(named):
    load_config({**MB, "zero_optimization": {"stage": 2, "reduce_bucket_size": 100}, "fp16": {"enabled": True}}, 1)
    assert named() == []
    config = {**MB, "steps_per_print": 10, "checkpoint": {"load_universal": True}}
    load_config(config, 1)
    load_config(config, 1)
    assert named() == [
        "zero_core: accepted, not acted on: steps_per_print (the engine prints no periodic log), "
        "checkpoint.load_universal (zbench checkpoints always reshard on load)"
    ]


def test_only_rank_0_names_them(named, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    load_config({**MB, "steps_per_print": 10}, 2)
    assert named() == []


def _other_value(row) -> object:
    """A value of the key's type that zero_core refuses."""
    value = row.accepts[0]
    if isinstance(value, bool):
        return not value
    numbers = [v for v in row.accepts if isinstance(v, int)]
    return max(numbers) + 1 if numbers else "bf16" if row.path.endswith("_dtype") else 1


@pytest.mark.parametrize("row", [k for k in KEYS if k.status == REFUSED], ids=lambda k: k.path)
def test_refused_keys_are_refused(row):
    config = {**MB, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
              "optimizer": {"type": "AdamW"}}
    if not row.accepts:
        _set(config, row.path, {})
        with pytest.raises(ConfigError, match=f"^key '{row.path}' is not supported by zero_core; "):
            load_config(config, 1)
        return
    for value in row.accepts:  # each value that changes nothing loads, and the key is named like an ignored one
        _set(config, row.path, {row.switch: value} if row.switch else value)
        load_config(config, 1)
    _set(config, row.path, {row.switch: _other_value(row)} if row.switch else _other_value(row))
    with pytest.raises(ConfigError) as info:
        load_config(config, 1)
    assert str(info.value).startswith(row.path) and "\n" not in str(info.value)
    if row.why in str(info.value):  # a value zero_core reads but does not do: the reason and the fix
        accepted = json.dumps(row.accepts[0])
        assert str(info.value).endswith(f"or set {accepted}") or str(info.value).endswith(f"to {accepted}")


def test_docs_tables_match_the_code():
    text = config_table.DOC.read_text(encoding="utf-8")
    assert config_table.doc_block(text) == config_table.block(), "run `python tests/config_table.py --write`"
    assert len(text.splitlines()) < 300  # the repository's limit for a file


def test_steps_per_print_inf_reads_as_never():
    """Accelerate's DeepSpeed plugin writes `steps_per_print: inf` into every config it passes on."""
    assert load_config({**MB, "steps_per_print": float("inf")}, 1).steps_per_print is None
    with pytest.raises(ValueError, match="steps_per_print must be an integer >= 1"):
        load_config({**MB, "steps_per_print": float("-inf")}, 1)
