"""SIGTERM/SIGINT handling shared by tessera's long-running processes: a signal sets a stop event."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType

import structlog

log = structlog.get_logger(__name__)

Handler = Callable[[int, FrameType | None], object] | int | None


def stop_on_signals(stop: threading.Event) -> dict[int, Handler]:
    """Make SIGTERM and SIGINT set `stop`; returns the previous handlers for `restore_handlers`.

    Python installs handlers only from the main thread.
    """

    def handle(signum: int, frame: FrameType | None) -> None:
        del frame
        log.info("shutting down", signal=signal.Signals(signum).name)
        stop.set()

    return {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}


def restore_handlers(previous: dict[int, Handler]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)
