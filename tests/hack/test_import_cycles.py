"""hack/import_cycles.py: finds circles through function-level and type-only imports, and backwards imports."""

from __future__ import annotations

from pathlib import Path

from hack.import_cycles import backwards_imports, import_graph, one_cycle, strongly_connected


def _tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_circle_through_a_function_level_import_is_found(tmp_path: Path) -> None:
    _tree(tmp_path, {
        "driver/__init__.py": "",
        "driver/a.py": "from driver.b import thing\n",
        "driver/b.py": "def thing():\n    from driver import c\n",
        "driver/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import x\n",
        "driver/d.py": "import driver.a\n",
    })  # fmt: skip
    graph = import_graph(tmp_path, ["driver"])
    assert strongly_connected(graph) == [["driver.a", "driver.b", "driver.c"]]
    assert one_cycle(graph, ["driver.a", "driver.b", "driver.c"]) == ["driver.a", "driver.b", "driver.c", "driver.a"]


def test_no_circle_and_backwards_imports(tmp_path: Path) -> None:
    _tree(tmp_path, {
        "driver/__init__.py": "",
        "driver/a.py": "import json\nfrom kubeletplugin import b\n",
        "kubeletplugin/__init__.py": "",
        "kubeletplugin/b.py": "from driver import b as other\n",
        "controller/__init__.py": "",
        "controller/c.py": "from kubeletplugin.b import x\nfrom driver.a import y\n",
    })  # fmt: skip
    graph = import_graph(tmp_path, ["driver", "kubeletplugin", "controller"])
    assert strongly_connected(graph) == []
    assert backwards_imports(graph) == [("controller.c", "kubeletplugin.b"), ("driver.a", "kubeletplugin.b")]
