"""Fixtures shared across the test folders. Builders and fakes are plain modules (tests/builders/,
tests/fakes/); a fixture lives here only when tests in more than one folder ask for it by name."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog

from controller.admission import AdmissionHandler
from tests.builders.admission import dgx_handler


@pytest.fixture(autouse=True)
def _structlog_defaults() -> Iterator[None]:
    """Whatever a test configures (`tessera` entry points call configure_logging, which sends logs to
    stderr), the next test starts with structlog's defaults: tests that read logs must not depend on
    which folder ran before theirs."""
    yield
    structlog.reset_defaults()


@pytest.fixture(scope="module")
def handler() -> AdmissionHandler:
    """The webhook's handler over one simulated DGX H100 (a module may define its own `handler`)."""
    return dgx_handler()
