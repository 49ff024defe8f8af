"""A new user's first run: an edge project whose migrations are not applied. A wake-up still
gets its 202 (a wake-up is only a hint), but the drain's `drain.end` line, the `queue.error`
line of its check-in and a metrics scrape's 503 each say what is missing and what to do, as the
Python worker does (apply the migrations: supabase db push, or supabase migration up
locally), not only the Data API's own words."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from testkit.cluster import Cluster
from testkit.postgrest import PostgRESTStandIn
from tests.support.wake_signing import post_wake

from .deno_worker import Deno, EdgeWorker, start_edge_worker, stop_edge_worker

MIGRATE = "apply them (supabase db push, or supabase migration up locally)"


@pytest.fixture(scope="module")
def bare_api(stack: Cluster) -> Iterator[PostgRESTStandIn]:
    """The Data API over a database of the stack where no migration ran."""
    with stack.connect(autocommit=True) as conn:
        conn.execute("drop database if exists unmigrated")
        conn.execute("create database unmigrated")
    with PostgRESTStandIn(stack.dsn("unmigrated", user="authenticator")) as api:
        yield api


@pytest.fixture
def worker(deno: Deno, function_dir: Path, bare_api: PostgRESTStandIn) -> Iterator[EdgeWorker]:
    worker = start_edge_worker(deno, function_dir, bare_api, PGQUEUE_LINGER_MS="0")
    yield worker
    stop_edge_worker(worker)


def logged(worker: EdgeWorker, event: str, timeout: float = 20) -> list[dict]:
    deadline = time.monotonic() + timeout
    while not (found := [e for e in worker.events() if e["event"] == event]):
        assert time.monotonic() < deadline, f"no {event} line:\n{worker.output()}"
        time.sleep(0.05)
    return found


def test_a_wake_up_logs_that_the_migrations_are_not_applied(worker: EdgeWorker) -> None:
    response = post_wake(worker.url, worker.wake_secret)
    assert response.status_code == 202, response.text
    (end,) = logged(worker, "drain.end")
    assert end["stoppedBy"] == "error"
    # the Data API's own words first, then what they mean for this project
    assert "pgqueue.complete_and_claim() failed through" in end["error"]
    missing = "the queue's migrations are not all applied to this database"
    assert f"{missing}: {MIGRATE}" in end["error"]
    errors = logged(worker, "queue.error")
    assert {e["call"] for e in errors} >= {"checkin"}, errors
    assert all(MIGRATE in e["error"] for e in errors), errors


def test_a_metrics_scrape_says_the_migrations_are_not_applied(worker: EdgeWorker) -> None:
    response = httpx.get(
        f"{worker.url}/metrics", headers={"Authorization": f"Bearer {worker.key}"}, timeout=20
    )
    assert response.status_code == 503
    assert MIGRATE in response.json()["error"], response.text
