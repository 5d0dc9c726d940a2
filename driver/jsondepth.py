"""How deeply a parsed JSON document nests, measured without recursion.

Whatever later walks a document recursively (deepcopy, comparisons, json.dumps, the checks) can hit
Python's recursion limit on input that parsed fine, so readers of untrusted JSON (the webhook's
request bodies, the node agent's checkpoint) measure it first with this walker.
"""

from __future__ import annotations

from typing import Any


def json_depth(doc: Any) -> int:
    """The number of nested containers: a scalar is 0, `{}` and `[1]` are 1, `{"a": [1]}` is 2."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(doc, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        stack.extend((child, depth) for child in children)
    return deepest
