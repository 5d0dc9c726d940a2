"""A review flows one way down: controller entry points -> controller.checks -> controller.cluster.

Nothing in controller.cluster imports controller.checks, and neither imports an entry point
(admission, webhook, app, metrics, offline, explain), so a reader walking one review never has to
climb back up. Lazy imports inside functions count too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.paths import REPO

ROOT = REPO
ENTRY_POINTS = ("controller.admission", "controller.webhook", "controller.app", "controller.metrics",
                "controller.offline", "controller.explain")


def imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package.replace(".", "/")).glob("*.py"))


def below(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize("path", modules("controller.cluster"), ids=lambda p: p.name)
def test_cluster_view_imports_no_check_and_no_entry_point(path: Path) -> None:
    upward = sorted(n for n in imports(path) if below(n, ("controller.checks", *ENTRY_POINTS)))
    assert not upward, f"controller/cluster/{path.name} reaches up into {upward}"


@pytest.mark.parametrize("path", modules("controller.checks"), ids=lambda p: p.name)
def test_checks_import_no_entry_point(path: Path) -> None:
    upward = sorted(n for n in imports(path) if below(n, ENTRY_POINTS))
    assert not upward, f"controller/checks/{path.name} reaches up into {upward}"


# The fields that say what a request asks for, read from the claim's JSON in one module only, so the checks,
# the multi-card rewrite and `tessera explain` cannot read a claim two ways.
SPEC_FIELDS = ('"exactly"', '"firstAvailable"', '"allocationMode"')


@pytest.mark.parametrize("path", sorted((ROOT / "controller").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_claim_specs_are_walked_only_in_claimspec(path: Path) -> None:
    if path.name == "claimspec.py":
        return
    text = path.read_text()
    read = [f for f in SPEC_FIELDS if f".get({f}" in text or f"[{f}]" in text]
    assert not read, f"{path.relative_to(ROOT)} reads {', '.join(read)} itself; use controller.checks.claimspec"
