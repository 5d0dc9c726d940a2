"""driver.names: the one place a result's "req/sub" request name is taken apart."""

from __future__ import annotations

import pytest

from driver.names import base_request, subrequest


@pytest.mark.parametrize(("ref", "base", "sub"), [("gpu", "gpu", ""), ("gpu/full", "gpu", "full"),
                                                  ("gpu/a/b", "gpu", "a/b"), ("", "", "")])
def test_a_request_name_splits_into_the_request_and_its_subrequest(ref: str, base: str, sub: str) -> None:
    assert (base_request(ref), subrequest(ref)) == (base, sub)
