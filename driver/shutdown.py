"""SIGTERM/SIGINT handling shared by tessera's long-running processes: a signal sets a stop event."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType

import structlog

log = structlog.get_logger(__name__)

Handler = Callable[[int, FrameType | None], object] | int | None


_received: list[str] = []  # the signals a handler saw, for wait_for_stop's log line


def stop_on_signals(stop: threading.Event) -> dict[int, Handler]:
    """Make SIGTERM and SIGINT set `stop`; returns the previous handlers for `restore_handlers`.

    Python installs handlers only from the main thread. The handler logs nothing: it runs between two
    bytecodes of the main thread, which may be in the middle of writing a log line and holding the
    logger's lock, and would then wait for that lock forever (a controller that never exited on SIGTERM).
    `wait_for_stop` logs once the main thread is back in ordinary code.
    """

    def handle(signum: int, frame: FrameType | None) -> None:
        del frame
        _received.append(signal.Signals(signum).name)
        stop.set()

    return {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}


def wait_for_stop(stop: threading.Event) -> None:
    """Block until `stop` is set, then say why (the signal, when a handler of stop_on_signals set it)."""
    stop.wait()
    log.info("shutting down", signal=_received[-1] if _received else None)


def restore_handlers(previous: dict[int, Handler]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)
