import os
import signal
import threading

from driver.shutdown import restore_handlers, stop_on_signals


def test_sigterm_and_sigint_set_the_stop_event_and_the_old_handlers_come_back():
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    for sig in (signal.SIGTERM, signal.SIGINT):
        stop = threading.Event()
        previous = stop_on_signals(stop)
        try:
            os.kill(os.getpid(), sig)
            assert stop.wait(5)
        finally:
            restore_handlers(previous)
        assert {s: signal.getsignal(s) for s in before} == before


def test_a_signal_that_arrives_while_a_log_line_is_being_written_still_stops_the_process():
    """The handler runs in the main thread between two bytecodes, possibly while that thread holds the
    logger's write lock: a handler that logs waits for the lock forever. Run in a child process, since
    the old handler hung its process."""
    import subprocess
    import sys

    code = (
        "import os, signal, threading, structlog\n"
        "from driver.logsetup import configure_logging\n"
        "from driver.shutdown import stop_on_signals, wait_for_stop\n"
        "configure_logging('json')\n"
        "stop = threading.Event()\n"
        "stop_on_signals(stop)\n"
        "logger = structlog.get_logger()\n"
        "logger.info('warm up')\n"  # the PrintLogger and its lock exist now
        "lock = structlog.get_config()['logger_factory']()._lock\n"
        "with lock:\n"  # as if the main thread were writing a line when SIGTERM came
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "wait_for_stop(stop)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert '"event": "shutting down"' in proc.stderr and '"signal": "SIGTERM"' in proc.stderr
