"""YAML loading with bounds, for files a user hands tessera (`tessera check`, simulated profiles).

PyYAML's safe loader shares the node an alias points at, so "a billion laughs" (nine anchors of
nine aliases each) loads fast, and then every walk over the result (checks, copies, dumps) visits
each shared node once per path: gigabytes and no answer. So the composed node graph is measured
before anything is built: the size the document has once every alias is expanded may exceed the
number of distinct nodes by at most MAX_ALIAS_EXPANSION, an alias may not point into its own
node (a cycle), and the text itself is capped at MAX_BYTES.
"""

from __future__ import annotations

from typing import Any

import yaml

from driver.errors import InvalidInputError

MAX_BYTES = 16 * 1024 * 1024
MAX_ALIAS_EXPANSION = 1_000_000


class YamlLimitError(InvalidInputError):
    """A document over tessera's size or alias limits; the message names the limit."""


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def expanded_size(root: yaml.Node, limit: int) -> tuple[int, int]:
    """(nodes once aliases are expanded, distinct nodes); YamlLimitError past `limit` extra or on a cycle.

    Iterative, memoized by node identity: shared nodes are measured once however often they are used.
    """
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            on_path.discard(key)
            sizes[key] = 1 + sum(sizes[id(c)] for c in _children(node))
            if sizes[key] - len(sizes) > limit:
                raise YamlLimitError(
                    f"aliases expand the document by more than {limit:,} nodes (an alias bomb?); "
                    "write the repeated parts out instead"
                )
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise YamlLimitError("an alias refers to a node that contains it (a cycle); tessera cannot check that")
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in sizes)
    return sizes[id(root)], len(sizes)


class BoundedLoader(yaml.SafeLoader):
    """SafeLoader that measures each document's node graph before constructing it."""

    def construct_document(self, node: yaml.Node) -> Any:
        expanded_size(node, MAX_ALIAS_EXPANSION)
        return super().construct_document(node)


def _check_text(text: str) -> None:
    if len(text) > MAX_BYTES:
        raise YamlLimitError(f"{len(text):,} characters, over the {MAX_BYTES:,}-byte limit for one file")


def load_all(text: str) -> list[Any]:
    """Every document of `text`; YamlLimitError over the limits, yaml.YAMLError when it is not YAML."""
    _check_text(text)
    try:
        return list(yaml.load_all(text, Loader=BoundedLoader))
    except RecursionError:
        raise YamlLimitError("nested too deeply to parse") from None


def load(text: str) -> Any:
    """The single document of `text`, with the limits of load_all."""
    _check_text(text)
    try:
        return yaml.load(text, Loader=BoundedLoader)
    except RecursionError:
        raise YamlLimitError("nested too deeply to parse") from None
