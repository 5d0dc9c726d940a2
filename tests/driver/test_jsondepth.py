"""One walker measures how deeply a JSON document nests, for the webhook's bodies and the checkpoint."""

from __future__ import annotations

import pytest

from driver.jsondepth import json_depth


@pytest.mark.parametrize(("doc", "depth"), [(1, 0), ("x", 0), ({}, 1), ([1, 2], 1), ({"a": [1]}, 2),
                                            ({"a": {"b": {}}, "c": 1}, 3), ([[], [[[]]]], 4)])  # fmt: skip
def test_depth_counts_nested_containers(doc: object, depth: int) -> None:
    assert json_depth(doc) == depth


def test_a_document_deeper_than_the_recursion_limit_is_measured() -> None:
    nested: object = []
    for _ in range(50_000):
        nested = [nested]
    assert json_depth(nested) == 50_001
