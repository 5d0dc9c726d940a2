"""What a check says about an object: an error or a warning, tied to the field it is about."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warning"]

DOCS_ATTRIBUTES = "docs/attributes.md"


@dataclass(frozen=True)
class Finding:
    """One problem with one field. `path` is the JSON field path inside the object, e.g.
    `spec.selectors[0].cel.expression`; `message` says what is wrong and how to fix it."""

    severity: Severity
    path: str
    message: str

    def __post_init__(self) -> None:
        if self.severity not in ("error", "warning"):
            raise ValueError(f"severity must be 'error' or 'warning', got {self.severity!r}")

    def __str__(self) -> str:
        return f"{self.severity}: {self.path}: {self.message}"


def error(path: str, message: str) -> Finding:
    return Finding("error", path, message)


def warning(path: str, message: str) -> Finding:
    return Finding("warning", path, message)


def has_errors(findings: list[Finding] | tuple[Finding, ...]) -> bool:
    return any(f.severity == "error" for f in findings)
