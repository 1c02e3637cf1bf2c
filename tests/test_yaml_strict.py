"""zbench's YAML reader: plain data only, duplicate keys named with their lines, alias bombs and deep
nesting refused from the composed node graph before anything is built, numbers read as numbers."""

from __future__ import annotations

import pytest
import yaml

from zbench import yaml_strict
from zbench.yaml_strict import MAX_DEPTH, MAX_NODES, read_yaml


class Refused(ValueError):
    pass


def load(tmp_path, text: str | bytes):
    path = tmp_path / "f.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return read_yaml(str(path), "scenario", Refused)


def refused(tmp_path, text: str | bytes) -> str:
    with pytest.raises(Refused) as e:
        load(tmp_path, text)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_plain_data_and_yaml_1_2_numbers(tmp_path):
    data = load(tmp_path, "lr: 1e-4\nbig: 1e30\nplain: 3.0e-3\nn: 1_000\ns: '1e3'\nnot_a_number: 1e\n")
    assert data == {"lr": 1e-4, "big": 1e30, "plain": 3e-3, "n": 1000, "s": "1e3", "not_a_number": "1e"}
    assert load(tmp_path, "") is None


def test_duplicate_keys_are_named_with_both_lines(tmp_path):
    assert "has the key 'seq_len' twice in one mapping (lines 1 and 3); keep one" in refused(
        tmp_path, "seq_len: 1\na: 2\nseq_len: 3\n"
    )
    assert "has the key 'x' twice" in refused(tmp_path, "m: {x: 1, y: 2, x: 3}\n")


def test_merge_keys_may_override_what_they_merge(tmp_path):
    assert load(tmp_path, "base: &b {x: 1, y: 2}\nd: {<<: *b, x: 3}\n")["d"] == {"x": 3, "y": 2}


def _bomb(levels: int) -> str:
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_alias_bomb_is_refused_before_anything_is_built(tmp_path, monkeypatch):
    built = []
    monkeypatch.setattr(
        yaml_strict._StrictLoader,
        "construct_document",
        lambda self, node: built.append(node) or yaml.SafeLoader.construct_document(self, node),
    )
    assert f"expands to more than {MAX_NODES:,} values through its aliases" in refused(tmp_path, _bomb(12))  # 9**12
    assert built == []  # refused from the node graph: nothing constructed, let alone expanded
    assert len(load(tmp_path, _bomb(4))["l3"]) == 9  # 9**4 values: a legitimate use of aliases still loads


def test_a_bomb_is_sized_in_one_visit_per_node():
    """9**30 values after expansion; counted, the graph has a few hundred distinct nodes."""
    root = yaml.compose(_bomb(30), Loader=yaml_strict._StrictLoader)
    sizes = yaml_strict.expanded_sizes(root)
    assert sizes[id(root)][0] == MAX_NODES + 1  # capped: never the real 9**30
    assert len(sizes) == 1 + 30 + 30 + 9  # root, 30 keys, 30 lists, 9 "lol" strings: aliases reuse nodes


def test_recursive_alias_and_deep_nesting_are_refused(tmp_path):
    assert "refers to itself through an alias" in refused(tmp_path, "a: &a [1, *a]\n")
    assert f"nests deeper than {MAX_DEPTH} levels at line 1" in refused(tmp_path, "[" * 5000 + "]" * 5000)
    chain = "a0: &a0 " + "[" * 40 + "1" + "]" * 40 + "\n" + "a1: &a1 " + "[" * 40 + "*a0" + "]" * 40 + "\n"
    assert "once its aliases (*name) are expanded" in refused(tmp_path, chain)


def test_python_tags_binary_and_huge_files_are_refused(tmp_path):
    assert "zbench reads plain YAML data only" in refused(tmp_path, "x: !!python/object/apply:os.system ['true']\n")
    assert "is not valid YAML" in refused(tmp_path, b"a: \xff\n")
    assert "larger than 1 MiB" in refused(tmp_path, "a: " + "x" * (1 << 20) + "\n")
    with pytest.raises(Refused, match="cannot read scenario .*: No such file or directory; pass an existing YAML file"):
        read_yaml(str(tmp_path / "missing.yaml"), "scenario", Refused)
