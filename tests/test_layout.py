"""The layout of tests/ itself: test modules import builders and fakes, never each other; every folder
is a package, so two test files may share a name in different folders; tests sit in the folder of the
source they test, not at the top."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.paths import REPO, TESTS

# Folders whose Python files may import test helpers: none of them may import a test module.
IMPORTERS = ("tests", "e2e", "benchmarks")


def _is_test_module(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "tests" and any(part.startswith("test_") for part in parts)


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            # `from tests.kubeletplugin import test_state` imports a test module too
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def test_no_module_imports_a_test_module() -> None:
    offenders = [
        f"{path.relative_to(REPO)}:{line}: {module}"
        for folder in IMPORTERS
        for path in sorted((REPO / folder).rglob("*.py"))
        for line, module in _imported_modules(path)
        if _is_test_module(module)
    ]
    assert not offenders, (
        "shared test code belongs in tests/builders/, tests/fakes/ or a conftest.py fixture:\n" + "\n".join(offenders)
    )


def test_every_test_folder_is_a_package() -> None:
    folders = {p.parent for p in TESTS.rglob("*.py")}
    missing = sorted(str(f.relative_to(REPO)) for f in folders if not (f / "__init__.py").exists())
    assert not missing, f"folders without __init__.py (their test modules' names would clash): {missing}"


def test_test_modules_sit_in_the_folder_of_what_they_test() -> None:
    top = sorted(p.name for p in TESTS.glob("test_*.py") if p.name != Path(__file__).name)
    assert not top, f"move these into the tests/ folder that mirrors their source folder: {top}"
