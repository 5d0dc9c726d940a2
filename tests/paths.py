"""Where tests find the repository and the data files they share, whatever folder a test lives in."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
CDI_SCHEMA = TESTS / "schemas" / "cdi-spec.schema.json"
