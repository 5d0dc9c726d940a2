"""structlog configuration shared by every tessera process: JSON in production, readable on a terminal."""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog

LogFormat = Literal["auto", "json", "console"]


def configure_logging(fmt: LogFormat = "auto", level: str = "info") -> None:
    """Configure structlog once per process; `auto` picks console output only for a TTY on stderr."""
    use_console = fmt == "console" or (fmt == "auto" and sys.stderr.isatty())
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer() if use_console else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
