"""YAML as the harness reads it: config files, sweep files and ``--set`` values.

:func:`load` is ``yaml.safe_load`` that also refuses, as a ``yaml.YAMLError`` whose message
says what and where, what would otherwise be silently wrong or cost without bound:

- a key repeated in one mapping (`DuplicateKeyError`; the second would silently win);
- a document that expands to more than `MAX_VALUES` values (`YamlTooLarge`): aliases
  (``*name``) share one node, so nine nested levels of nine aliases (~500 bytes) are a
  billion values to whatever walks them (an error message's ``repr``, a JSON copy, a merge)
  and take minutes and all memory; the expansion is counted on the composed nodes, before
  any Python object is built;
- an alias inside the node it refers to (a recursive structure), and nesting too deep for
  the parser's recursion (`YamlTooLarge`);
- a scalar that cannot become a value, such as an integer of more than 4,300 digits (Python's
  limit) or an impossible date (`YamlBadValue`, instead of a ``ValueError`` traceback).
"""
from __future__ import annotations

from typing import Any

import yaml

from harness.foundation.base import ECHO_LIMIT, brief

__all__ = ["MAX_VALUES", "DuplicateKeyError", "YamlTooLarge", "YamlBadValue", "StrictLoader", "load"]

MAX_VALUES = 100_000
"""Most values (scalars, lists and mappings, aliases counted as often as they are used) one
YAML document may expand to; a config or sweep file holds a few hundred."""


class DuplicateKeyError(yaml.YAMLError):
    """A YAML mapping names one key twice (the second would silently win)."""


class YamlTooLarge(yaml.YAMLError):
    """A YAML document expands (through aliases) to more than `MAX_VALUES` values, refers to
    itself, or nests too deeply."""


class YamlBadValue(yaml.YAMLError):
    """A YAML scalar that cannot be converted (an integer beyond Python's digit limit, a bad date)."""


def _children(node: yaml.Node) -> list:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_expansion(root: yaml.Node, limit: int = MAX_VALUES) -> None:
    """Raise `YamlTooLarge` if ``root`` expands to more than ``limit`` values or contains
    itself. Each distinct node is visited once (sizes memoised), without recursion."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()  # the nodes on the path from the root to the current one
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        nid = id(node)
        if done:
            open_nodes.discard(nid)
            size = 1 + sum(sizes[id(c)] for c in _children(node))
            if size > limit:
                where = node.start_mark
                aliased = len(sizes) + 1 < limit  # far fewer distinct nodes: aliases multiply them
                raise YamlTooLarge(
                    (f"aliases (*name) expand it to more than {limit:,} values" if aliased else
                     f"it holds more than {limit:,} values")
                    + f" (the {'mapping' if isinstance(node, yaml.MappingNode) else 'list'} at line "
                      f"{where.line + 1}, column {where.column + 1}); a config or sweep file needs far "
                      f"fewer: write the values out or use fewer nested aliases")
            sizes[nid] = size
            continue
        if nid in sizes:
            continue
        open_nodes.add(nid)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in open_nodes:
                mark = child.start_mark
                raise YamlTooLarge(f"an alias refers to a node that contains it (a recursive structure, "
                                   f"line {mark.line + 1}); write the values out")
            if id(child) not in sizes:
                stack.append((child, False))


class StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses repeated keys and documents that expand beyond `MAX_VALUES`."""

    def compose_document(self):
        node = super().compose_document()
        if node is not None:
            _check_expansion(node)
        return node


def _construct_mapping(loader: StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # `<<: *base` merges (SafeLoader's flattening below); its keys may be overridden
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:
            continue  # SafeLoader reports an unhashable key itself
        if key in seen:
            shown = key if isinstance(key, str) and len(key) <= ECHO_LIMIT else brief(key)
            raise DuplicateKeyError(f"duplicate key '{shown}' (line {seen[key] + 1} and line "
                                    f"{key_node.start_mark.line + 1}): each key may appear once per mapping")
        seen[key] = key_node.start_mark.line
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load(text: str) -> Any:
    """``yaml.safe_load(text)`` with the refusals above (each a ``yaml.YAMLError``)."""
    try:
        return yaml.load(text, Loader=StrictLoader)
    except RecursionError:
        raise YamlTooLarge("nested too deeply (lists or mappings inside each other hundreds of levels "
                           "deep); a config or sweep file needs a few levels") from None
    except yaml.YAMLError:
        raise
    except ValueError as e:  # int() beyond 4,300 digits, an impossible timestamp, ...
        msg = " ".join(str(e).split())
        msg = msg if len(msg) <= ECHO_LIMIT else msg[:ECHO_LIMIT] + "..."
        raise YamlBadValue(f"a value cannot be read: {msg}") from None
