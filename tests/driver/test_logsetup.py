import io
import json
import sys

import structlog

from driver.logsetup import configure_logging


def test_logs_follow_a_replaced_stderr_instead_of_writing_to_the_closed_one(monkeypatch):
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    configure_logging("json", "info")
    first.close()
    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)

    structlog.get_logger("t").info("prepared", claim="a")

    record = json.loads(second.getvalue())
    assert record["event"] == "prepared" and record["claim"] == "a" and record["level"] == "info"


def test_level_filter_drops_debug(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    configure_logging("json", "warning")
    log = structlog.get_logger("t")
    log.info("quiet")
    log.warning("loud")
    assert [json.loads(line)["event"] for line in out.getvalue().splitlines()] == ["loud"]
