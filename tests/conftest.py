"""Fixtures shared across the test folders. Builders and fakes are plain modules (tests/builders/,
tests/fakes/); a fixture lives here only when tests in more than one folder ask for it by name."""

from __future__ import annotations

import pytest

from controller.admission import AdmissionHandler
from tests.builders.admission import dgx_handler


@pytest.fixture(scope="module")
def handler() -> AdmissionHandler:
    """The webhook's handler over one simulated DGX H100 (a module may define its own `handler`)."""
    return dgx_handler()
