"""Every YAML file zbench reads (scenarios, Accelerate configs) goes through here: plain data only.

PyYAML's safe loader already refuses tags that would build Python objects. On top of it:

- a key given twice in one mapping is an error naming the key and both lines (PyYAML keeps the last);
- the document is composed first and its size counted with aliases expanded, memoised per node (an
  alias reuses its anchor's node object), so a "billion laughs" file is refused after work
  proportional to its text, never expanded; nesting depth and file size are bounded too;
- numbers in exponent form without a dot (`1e-4`, `1e30`) are floats, as YAML 1.2 and JSON read
  them, not the strings YAML 1.1 makes of them, so a bound on a number sees a number.
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_BYTES = 1 << 20  # 1 MiB: scenarios and Accelerate configs are a few hundred bytes
MAX_NODES = 100_000  # values after alias expansion
MAX_DEPTH = 64  # nested mappings/lists


class _StrictLoader(yaml.SafeLoader):
    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        self._depth += 1  # the composer recurses: bound it before Python's own limit does
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise _Refused(f"nests deeper than {MAX_DEPTH} levels at line {mark.line + 1}; flatten it")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if isinstance(key_node, ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = self.construct_object(key_node)
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise _Refused(
                        f"has the key '{str(key)[:60]}' twice in one mapping (lines {seen[key]} and {line}); keep one"
                    )
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789")
)


class _Refused(Exception):
    """A document that is valid YAML but not one zbench reads (the caller adds the file's name)."""


def expanded_sizes(root: Node) -> dict[int, tuple[int, int]]:
    """id(node) -> (values, depth) of every distinct node below `root` as if its aliases were expanded,
    capped just past MAX_NODES and MAX_DEPTH. Each node is sized once (an alias is its anchor's node
    object), iteratively, so the work is the text's, not the expansion's, and depth costs no stack."""
    size: dict[int, tuple[int, int]] = {}
    active: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in size:
            continue
        kids = (
            [n for pair in node.value for n in pair]
            if isinstance(node, MappingNode)
            else list(node.value)
            if isinstance(node, SequenceNode)
            else []
        )
        if children_done:
            active.discard(key)
            size[key] = (
                min(MAX_NODES + 1, 1 + sum(size[id(k)][0] for k in kids)),
                min(MAX_DEPTH + 1, 1 + max((size[id(k)][1] for k in kids), default=0)),
            )
            continue
        if key in active:
            raise _Refused("refers to itself through an alias (a recursive structure); remove the alias")
        active.add(key)
        stack.append((node, True))
        stack.extend((k, False) for k in kids if id(k) not in size)
    return size


def _check_expansion(root: Node) -> None:
    values, depth = expanded_sizes(root)[id(root)]
    if values > MAX_NODES:
        raise _Refused(
            f"expands to more than {MAX_NODES:,} values through its aliases (*name); "
            "write the values out or remove the aliases"
        )
    if depth > MAX_DEPTH:
        raise _Refused(f"nests deeper than {MAX_DEPTH} levels once its aliases (*name) are expanded; remove them")


def _load(text: bytes) -> Any:
    loader = _StrictLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        _check_expansion(root)
        return loader.construct_document(root)
    finally:
        loader.dispose()


def read_yaml(path: str, what: str, error: type[ValueError]) -> Any:
    """The plain data in the YAML file `path`; `error` (one line naming `what` and `path`) otherwise."""
    try:
        with open(path, "rb") as f:
            text = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise error(f"cannot read {what} {path}: {e.strerror}; pass an existing YAML file") from None
    if len(text) > MAX_BYTES:
        raise error(f"{what} {path} is larger than {MAX_BYTES >> 20} MiB; a {what} is a short YAML file: pass one")
    try:
        return _load(text)
    except _Refused as e:
        raise error(f"{what} {path} {e}") from None
    except yaml.constructor.ConstructorError as e:  # a tag naming a Python object, or a non-scalar key
        raise error(
            f"{what} {path} line {e.problem_mark.line + 1}: {e.problem}; zbench reads plain YAML data only "
            "(no tags): remove it"
        ) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = " ".join(str(getattr(e, "problem", None) or e).split())
        raise error(f"{what} {path} is not valid YAML{where}: {problem}; fix the syntax") from None
