"""`broker/outage.py`: what the log says of an outage, driven by an injected clock (the real outage, with a
Redis server stopped under load, is in tests/test_outages.py)."""

from __future__ import annotations

import logging

import pytest

from threadline.broker.outage import Outage


def test_one_line_to_start_a_count_per_interval_and_one_to_end(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    outage = Outage("Redis", logging.getLogger("test.outage"), report_seconds=10, clock=lambda: now[0])
    caplog.set_level(logging.DEBUG, logger="test.outage")
    outage.recovered()  # no outage: nothing to say
    assert not outage.down and caplog.records == []
    for _ in range(50):  # 25 s of failures, one every 0.5 s, and a few stream events lost after each
        outage.failed(ConnectionError("Connection refused."))
        outage.unsent(3)
        now[0] += 0.5
    assert outage.down
    outage.recovered()
    outage.recovered()
    said = [r.getMessage() for r in caplog.records]
    assert said[0] == ("Redis unavailable: ConnectionError: Connection refused. Requests that need it answer 503, "
                       "stream events are not sent, runs go on; the listener resubscribes with backoff. A count "
                       "follows every 10 s while it lasts")
    assert said[1:3] == [
        "Redis still unavailable after 10 s: 21 exchanges failed and 60 stream events, ends and signals were "
        "not sent in the last 10 s",
        "Redis still unavailable after 20 s: 20 exchanges failed and 60 stream events, ends and signals were "
        "not sent in the last 10 s"]
    assert said[3:] == ["Redis is back after 25.0 s: 50 exchanges failed and 150 stream events, ends and "
                        "signals were not sent meanwhile"]
    assert not outage.down and not any(r.exc_info for r in caplog.records)


def test_a_second_outage_is_told_from_its_own_start(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    outage = Outage("Redis", logging.getLogger("test.outage"), report_seconds=10, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="test.outage")
    for start in (0.0, 100.0):
        now[0] = start
        outage.failed(TimeoutError())
        now[0] += 1
        outage.failed(TimeoutError())
        outage.recovered()
    said = [r.getMessage() for r in caplog.records]
    assert [s.split(":")[0] for s in said] == ["Redis unavailable", "Redis is back after 1.0 s"] * 2
    assert said[1] == said[3] == ("Redis is back after 1.0 s: 2 exchanges failed and 0 stream events, ends and "
                                  "signals were not sent meanwhile")
