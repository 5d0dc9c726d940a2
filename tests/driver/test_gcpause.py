"""The collector pause around large API answers: off inside, back as it was after, across threads."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from driver.gcpause import collector_paused, keep_for_good


@pytest.fixture(autouse=True)
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    gc.unfreeze()
    if was:
        gc.enable()
    else:
        gc.disable()


def test_the_collector_is_off_inside_and_on_again_after() -> None:
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_an_exception_inside_still_turns_it_back_on() -> None:
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("the apiserver went away")
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off() -> None:
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled()


def test_it_comes_back_only_when_the_last_of_several_threads_leaves() -> None:
    inside, release = threading.Event(), threading.Event()

    def slow_list() -> None:
        with collector_paused():
            inside.set()
            release.wait(5)

    other = threading.Thread(target=slow_list)
    other.start()
    assert inside.wait(5)
    with collector_paused():
        pass
    assert not gc.isenabled(), "one thread's end must not turn it on under another thread's decode"
    release.set()
    other.join(5)
    assert gc.isenabled()


def test_keep_for_good_takes_what_is_alive_out_of_the_collector_s_walks() -> None:
    kept = [{"spec": {"devices": [{"name": f"gpu-{i}"}]}} for i in range(1000)]
    keep_for_good()
    assert gc.get_freeze_count() >= len(kept)
