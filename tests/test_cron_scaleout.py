"""Crons scaled out: two worker processes (each running the scheduler) and an API process, sharing one
PostgreSQL and one Redis, over a per-second schedule. Every tick that fired has exactly one run, whichever
process claimed it, and no process ever tried to fire a tick another had claimed."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.services import ScaleOut
from tests.test_scaleout import Cluster
from threadline.core.crons import iso, tick_run_id

pytestmark = pytest.mark.e2e  # real processes

SECONDS = 8  # how long the crons run: 8 ticks each


@pytest.fixture
def cluster(scaleout_services: ScaleOut, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    monkeypatch.setenv("THREADLINE_CRON_POLL_SECONDS", "0.2")  # read by every process the cluster starts
    c = Cluster(scaleout_services.fresh(), tmp_path)
    try:
        c.start_worker()
        c.start_worker()
        c.start_api()  # `--workers 0`: it schedules nothing
        yield c
    finally:
        c.close()


def _runs_of(cluster: Cluster, cron_id: str) -> list[tuple[str, str, str]]:
    """(run_id, thread_id, status) of the cron's runs."""
    with psycopg.connect(cluster.backend.database_url) as conn:
        rows = conn.execute("SELECT run_id, thread_id, status FROM runs WHERE metadata->>'cron_id' = %s",
                            (cron_id,)).fetchall()
    return [(r[0], r[1], r[2]) for r in rows]


def _ticks(cron_id: str, runs: list[tuple[str, str, str]], start: datetime, end: datetime) -> dict[str, str]:
    """Each run's tick: the second in [start, end] whose derived run id it has (run id -> tick)."""
    by_id = {}
    moment = start.replace(microsecond=0)
    while moment <= end:
        tick = iso(moment)
        by_id[tick_run_id(cron_id, tick)] = tick
        moment += timedelta(seconds=1)
    return {run_id: by_id[run_id] for run_id, _, _ in runs if run_id in by_id}


def _settle(cluster: Cluster, cron_ids: list[str], deadline: float) -> None:
    """Until every run of the crons has finished."""
    while any(status in ("pending", "running") for cron_id in cron_ids for _, _, status in _runs_of(cluster, cron_id)):
        assert time.monotonic() < deadline, cluster.logs()
        time.sleep(0.1)


def test_two_schedulers_fire_each_tick_once(cluster: Cluster) -> None:
    [api] = cluster.apis
    thread = httpx.post(f"{api}/threads", json={}).json()["thread_id"]
    start = datetime.now(UTC)
    on_thread = httpx.post(f"{api}/threads/{thread}/runs/crons", json={
        "assistant_id": "counter", "schedule": "* * * * * *", "input": {"increment": 1}}).json()
    stateless = httpx.post(f"{api}/runs/crons", json={
        "assistant_id": "counter", "schedule": "* * * * * *", "input": {"increment": 1},
        "on_run_completed": "keep"}).json()
    crons = [on_thread["cron_id"], stateless["cron_id"]]
    time.sleep(SECONDS)
    for cron_id in crons:  # stop them, then let the last runs finish
        assert httpx.patch(f"{api}/runs/crons/{cron_id}", json={"enabled": False}).json()["enabled"] is False
    end = datetime.now(UTC)
    _settle(cluster, crons, time.monotonic() + 60)

    for cron_id in crons:
        runs = _runs_of(cluster, cron_id)
        ticks = _ticks(cron_id, runs, start, end)
        assert len(ticks) == len(runs), "a run that is no tick's"
        assert len(set(ticks.values())) == len(runs), "a tick with two runs"
        assert len(runs) >= 3, cluster.logs()  # the schedulers did fire, tick after tick
        assert all(status == "success" for _, _, status in runs)
        print(f"cron {cron_id}: {len(runs)} runs for {len(set(ticks.values()))} ticks in {SECONDS} s")
    # The thread cron's runs all ran on its thread, each once: the counter counted each of them.
    state = httpx.get(f"{api}/threads/{thread}/state").json()
    assert state["values"]["count"] == len(_runs_of(cluster, on_thread["cron_id"]))
    # The stateless cron's runs each had a thread of their own (kept: on_run_completed keep).
    stateless_runs = _runs_of(cluster, stateless["cron_id"])
    assert len({thread_id for _, thread_id, _ in stateless_runs}) == len(stateless_runs)
    # No scheduler ever lost a race it should not have entered (a duplicate run id would fail a pass).
    every_log = "".join(p.read_text() for p in cluster.tmp.glob("*.log"))
    assert "cron scheduler pass failed" not in every_log, cluster.logs()
