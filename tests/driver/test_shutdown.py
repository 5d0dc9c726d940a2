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
