"""End to end, the Edge Function's run-time choices: a wake-up lingers after its queues run
dry, so a job enqueued soon after runs without another POST (and PGQUEUE_LINGER_MS=0 turns
that off); claims ask for a short lease of their own (PGQUEUE_LEASE_SECONDS, 60 s by default),
whatever the database's configured lease, so a killed isolate's jobs come back soon.

The test's own POST is the only wake-up: the database has no worker URL or key here, so its
INSERT trigger sends nothing (checked at the end of each test)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.types.json import Jsonb

from testkit.postgrest import PostgRESTStandIn
from testkit.stack import point_wake_ups
from tests.support.wake_signing import post_wake

from .deno_worker import Deno, EdgeWorker, SlowReceiver, start_edge_worker, stop_edge_worker

EMAIL = {"to": "a@example.com", "subject": "Hi", "text": "."}


@pytest.fixture
def quiet_db(db: psycopg.Connection) -> psycopg.Connection:
    """The queue's database with no wake-up URL or key in this session: inserts wake nobody."""
    point_wake_ups(db, None, None)
    return db


@pytest.fixture
def worker_with(
    deno: Deno, function_dir: Path, postgrest: PostgRESTStandIn
) -> Iterator[Callable[..., EdgeWorker]]:
    """Starts the function with the given PGQUEUE_* settings; stops it after the test."""
    started: list[EdgeWorker] = []

    def start(**settings: str) -> EdgeWorker:
        worker = start_edge_worker(deno, function_dir, postgrest, **settings)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        stop_edge_worker(worker)


def enqueue(db: psycopg.Connection, kind: str, payload: dict) -> int:
    return db.execute("select pgqueue.enqueue(%s, %s)", (kind, Jsonb(payload))).fetchone()[0]


def wake(worker: EdgeWorker) -> dict:
    """One wake-up, as the database's POST would be."""
    response = post_wake(worker.url, worker.wake_secret, {"reason": "test", "queues": ["default"]})
    assert response.status_code == 202, response.text
    return response.json()


def status(db: psycopg.Connection, job_id: int) -> tuple[str, int]:
    return db.execute(
        "select status, attempts from pgqueue.all_jobs where id = %s", (job_id,)
    ).fetchone()


def wait_for_status(
    db: psycopg.Connection, job_id: int, wanted: str, worker: EdgeWorker, timeout: float = 20
) -> None:
    deadline = time.monotonic() + timeout
    while status(db, job_id)[0] != wanted:
        if time.monotonic() > deadline:
            pytest.fail(
                f"job {job_id} never became {wanted}: {status(db, job_id)}\n{worker.output()}"
            )
        time.sleep(0.02)


def summaries(worker: EdgeWorker) -> list[dict]:
    """The drain.end lines the function has logged: one per drain."""
    return [json.loads(line) for line in worker.lines if '"event":"drain.end"' in line]


def wait_for_summaries(worker: EdgeWorker, count: int, timeout: float = 20) -> list[dict]:
    deadline = time.monotonic() + timeout
    while len(summaries(worker)) < count:
        assert time.monotonic() < deadline, (
            f"fewer than {count} drain.end lines:\n{worker.output()}"
        )
        time.sleep(0.05)
    return summaries(worker)


def assert_the_database_sent_no_wake_up(db: psycopg.Connection) -> None:
    sent = db.execute(
        "select (select count(*) from net.http_request_queue)"
        " + (select count(*) from net._http_response)"
    ).fetchone()[0]
    assert sent == 0


def test_a_job_enqueued_after_the_queue_went_empty_runs_in_the_same_wake_up(
    quiet_db: psycopg.Connection, worker_with: Callable[..., EdgeWorker]
) -> None:
    db = quiet_db
    worker = worker_with()  # the defaults: a 2 s linger
    first = enqueue(db, "send_email", EMAIL)

    assert wake(worker)["joined"] is False
    wait_for_status(db, first, "done", worker)
    time.sleep(0.3)
    late = enqueue(db, "send_email", EMAIL)
    wait_for_status(db, late, "done", worker, timeout=5)

    [summary] = wait_for_summaries(worker, 1)
    assert summary["wakeUps"] == 1
    assert summary["claimed"] == summary["completed"] == 2
    # It stopped only after a whole linger window with nothing to do.
    assert summary["stoppedBy"] == "empty"
    assert summary["elapsedMs"] >= 300 + 2000
    assert_the_database_sent_no_wake_up(db)


def test_with_the_linger_off_a_later_job_waits_for_the_next_wake_up(
    quiet_db: psycopg.Connection, worker_with: Callable[..., EdgeWorker]
) -> None:
    db = quiet_db
    worker = worker_with(PGQUEUE_LINGER_MS="0")
    first = enqueue(db, "send_email", EMAIL)

    wake(worker)
    [summary] = wait_for_summaries(worker, 1)
    assert (summary["completed"], summary["stoppedBy"]) == (1, "empty")
    assert status(db, first) == ("done", 1)
    late = enqueue(db, "send_email", EMAIL)
    time.sleep(0.5)
    assert status(db, late) == ("queued", 0)

    wake(worker)
    wait_for_status(db, late, "done", worker)
    assert len(wait_for_summaries(worker, 2)) == 2
    assert_the_database_sent_no_wake_up(db)


@pytest.fixture
def configured_lease(quiet_db: psycopg.Connection) -> Iterator[int]:
    """The database's configured lease set to 37 s for one test, then put back."""
    before = quiet_db.execute("select pgqueue.configure() ->> 'lease_seconds'").fetchone()[0]
    quiet_db.execute("""select pgqueue.configure('{"lease_seconds": 37}')""")
    yield 37
    quiet_db.execute(
        "select pgqueue.configure(jsonb_build_object('lease_seconds', %s::int))", (before,)
    )


@pytest.mark.parametrize(
    ("settings", "lease"),
    [({}, 60), ({"PGQUEUE_LEASE_SECONDS": "45"}, 45)],
    ids=["the-default", "set-for-the-worker"],
)
def test_claims_ask_for_the_workers_short_lease_not_the_configured_one(
    quiet_db: psycopg.Connection,
    configured_lease: int,
    worker_with: Callable[..., EdgeWorker],
    settings: dict[str, str],
    lease: int,
) -> None:
    db = quiet_db
    worker = worker_with(**settings)
    with SlowReceiver(delay=1.5) as slow:
        job = enqueue(db, "send_webhook", {"url": slow.url})
        wake(worker)
        wait_for_status(db, job, "running", worker)
        held = db.execute(
            "select extract(epoch from locked_until - locked_at)"
            " from pgqueue.live_jobs where id = %s",
            (job,),
        ).fetchone()[0]
        assert held == lease
        wait_for_status(db, job, "done", worker)
    assert slow.hits == 1
    assert_the_database_sent_no_wake_up(db)
