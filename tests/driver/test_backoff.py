"""driver.backoff: exponential growth, the cap, the jitter band."""

from __future__ import annotations

import pytest

from driver.backoff import Backoff


def test_backoff_grows_exponentially_up_to_its_cap() -> None:
    backoff = Backoff(initial=0.5, maximum=4.0, jitter=0.0)
    assert [backoff.next() for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    backoff.reset()
    assert backoff.next() == 0.5


def test_backoff_jitter_stays_within_its_band_and_under_the_cap() -> None:
    low = Backoff(initial=1.0, maximum=10.0, jitter=0.2, rng=lambda: 0.0)
    high = Backoff(initial=1.0, maximum=10.0, jitter=0.2, rng=lambda: 1.0)
    assert low.next() == pytest.approx(0.8)
    assert high.next() == pytest.approx(1.2)
    for _ in range(100):
        assert high.next() <= 10.0
