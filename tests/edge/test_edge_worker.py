"""End to end: jobs INSERTed into the queue wake the Edge Function through pg_net; the
function (its own index.ts under `deno run`) claims them with supabase-js through the
PostgREST stand-in, runs the handlers and completes or fails each job: a job that ran to the
end is completed by the call that claims the next batch, and the last ones before the
function's work is over."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import psycopg
import pytest
from psycopg.types.json import Jsonb

from testkit.postgrest import PostgRESTStandIn
from testkit.stack import point_wake_ups, wait_for_pg_net
from tests.support.http_sink import HttpSink
from tests.support.wake_signing import secret_for, signed

from .deno_worker import Deno, EdgeWorker, SlowReceiver, start_edge_worker, stop_edge_worker


def point_wakeups_at(db: psycopg.Connection, worker: EdgeWorker, key: str | None = None) -> None:
    """Where the database's wake-ups go, and the secret they carry (the function's own unless
    `key` says otherwise), as `alter database ... set` makes them on a real project."""
    point_wake_ups(db, worker.url, key or worker.wake_secret)


def insert_jobs(db: psycopg.Connection, *jobs: dict) -> list[int]:
    """One INSERT statement (so one wake-up) of jobs given as kind/payload/max_attempts."""
    rows = db.execute(
        """
        insert into pgqueue.jobs (kind, payload, max_attempts)
        select j.kind, j.payload, coalesce(j.max_attempts, 5)
        from jsonb_to_recordset(%s) as j(kind text, payload jsonb, max_attempts int)
        returning id
        """,
        (Jsonb(list(jobs)),),
    ).fetchall()
    return [r[0] for r in rows]


def wait_for_jobs(
    db: psycopg.Connection, condition: str, worker: EdgeWorker, timeout: float = 30
) -> list[tuple]:
    """Poll until every job matches `condition` (SQL on pgqueue.all_jobs); return the jobs."""
    deadline = time.monotonic() + timeout
    while True:
        pending = db.execute(f"select count(*) from pgqueue.all_jobs where not ({condition})")
        if pending.fetchone()[0] == 0:
            return db.execute(
                "select id, kind, status, attempts, last_error from pgqueue.all_jobs order by id"
            ).fetchall()
        if time.monotonic() > deadline:
            jobs = db.execute("select * from pgqueue.all_jobs order by id").fetchall()
            pytest.fail(f"jobs never matched {condition!r}:\n{jobs}\n--- worker\n{worker.output()}")
        time.sleep(0.05)


def wake_responses(db: psycopg.Connection) -> list[int | None]:
    return [r[0] for r in db.execute("select status_code from net._http_response order by id")]


@pytest.fixture
def receiver() -> Iterator[HttpSink]:
    with HttpSink(status=200) as sink:
        yield sink


@pytest.mark.quick
def test_inserted_jobs_wake_the_function_and_all_end_done(
    db: psycopg.Connection, edge_worker: EdgeWorker, receiver: HttpSink
) -> None:
    point_wakeups_at(db, edge_worker)
    logged_before = len(edge_worker.lines)
    emails = [
        {"kind": "send_email", "payload": {"to": f"u{i}@example.com", "subject": "Hi", "text": "."}}
        for i in range(25)
    ]
    hooks = [
        {"kind": "send_webhook", "payload": {"url": receiver.url, "body": {"order": i}}}
        for i in range(5)
    ]
    ids = insert_jobs(db, *emails, *hooks)

    jobs = wait_for_jobs(db, "status = 'done'", edge_worker)

    assert [j[0] for j in jobs] == ids
    assert all(attempts == 1 and error is None for *_, attempts, error in jobs)
    # The function ran each of them (a finished job keeps no locked_by: its log says so).
    events = [json.loads(line) for line in edge_worker.lines[logged_before:] if line[:1] == "{"]
    assert sorted(e["id"] for e in events if e["event"] == "job.done") == ids
    # One statement, one wake-up, answered at once with 202.
    wait_for_pg_net(db)
    assert wake_responses(db) == [202]
    # The webhooks really went out, each with the job's idempotency key.
    assert sorted(r.json()["order"] for r in receiver.requests) == list(range(5))
    hook_ids = {f"send_webhook-{i}" for i in ids[25:]}
    keys = {
        v for r in receiver.requests for k, v in r.headers.items() if k.lower() == "idempotency-key"
    }
    assert keys == hook_ids
    # The function checked in: its kinds are not listed as unclaimed.
    checked_in = db.execute(
        "select queue, kinds from pgqueue.workers where worker like 'job-worker:%'"
    ).fetchall()
    assert ("default", ["send_email", "send_webhook"]) in [(q, sorted(k)) for q, k in checked_in]


def test_a_throwing_handler_is_retried_then_dead_lettered(
    db: psycopg.Connection, edge_worker: EdgeWorker
) -> None:
    point_wakeups_at(db, edge_worker)
    with HttpSink(status=500) as broken:
        failing, invalid, fine = insert_jobs(
            db,
            {"kind": "send_webhook", "payload": {"url": broken.url}, "max_attempts": 3},
            {"kind": "send_email", "payload": {"to": "nobody", "subject": "", "text": ""}},
            {"kind": "send_email", "payload": {"to": "a@example.com", "subject": "Hi", "text": ""}},
        )

        # The batch went on past the failures: the good job is done, the invalid payload is
        # dead-lettered at once, the webhook is back in the queue with its error stored.
        wait_for_jobs(
            db,
            f"""case id when {failing} then status = 'queued' and attempts = 1
                        when {invalid} then status = 'failed' and attempts = 1
                        when {fine} then status = 'done' end""",
            edge_worker,
        )
        invalid_error = db.execute(
            "select last_error from pgqueue.all_jobs where id = %s", (invalid,)
        )
        assert "invalid payload for send_email" in invalid_error.fetchone()[0]

        for attempt in (2, 3):
            # Skip the backoff, then let the sweeper re-wake the function, as it does each
            # minute while runnable jobs wait.
            db.execute("update pgqueue.jobs set run_after = now() where id = %s", (failing,))
            assert db.execute("select woke from pgqueue.sweep()").fetchone()[0] is True
            expected = "queued" if attempt < 3 else "failed"
            wait_for_jobs(
                db,
                f"id <> {failing} or (status = '{expected}' and attempts = {attempt})",
                edge_worker,
            )

    assert len(broken.requests) == 3
    dead = db.execute("select id, attempts, last_error from pgqueue.dead_letters").fetchall()
    assert sorted(d[0] for d in dead) == sorted([failing, invalid])
    error = next(d[2] for d in dead if d[0] == failing)
    assert f"POST {broken.url} answered 500" in error
    assert "send_webhook.ts" in error, "the stored error says where it was thrown"


def test_only_the_databases_signed_wake_up_gets_in_and_only_once(
    db: psycopg.Connection, deno: Deno, function_dir: Path, postgrest: PostgRESTStandIn
) -> None:
    """Wake-ups the database did not sign with the function's secret are refused and claim
    nothing: unsigned (a bearer token of any kind, as 1.1.0 sent the secret), signed with
    another key (the database's own, sent by the real pg_net, too), stale, with the body
    changed, or the database's real one sent a second time. Refusals are logged once a minute,
    saying what to check. A fresh function: no refusal of another test was logged before."""
    worker = start_edge_worker(deno, function_dir, postgrest, PGQUEUE_LINGER_MS="0")
    try:
        body = json.dumps({"queues": ["default"]}).encode()
        stale = datetime.now(tz=UTC) - timedelta(minutes=6)
        for headers, status in (
            ({}, 401),
            ({"Authorization": f"Bearer {worker.wake_secret}"}, 401),
            ({"Authorization": f"Basic {worker.wake_secret}"}, 401),
            # the service key the function runs with opens the Data API, not the wake-up
            ({"Authorization": f"Bearer {worker.key}"}, 401),
            (signed(secret_for("another-secret-than-the-functions"), body), 403),
            (signed(worker.wake_secret, body, at=stale), 403),
        ):
            response = httpx.post(worker.url, headers=headers, content=body)
            assert response.status_code == status, headers
            assert "PGQUEUE_WAKE_SECRET" in response.json()["error"]

        # The database's wake-up signed with another secret gets the same answer; the job waits.
        point_wakeups_at(db, worker, key=secret_for("a-stale-wake-secret-0123456789"))
        insert_jobs(
            db, {"kind": "send_email", "payload": {"to": "a@b.co", "subject": "x", "text": ""}}
        )
        wait_for_pg_net(db)
        assert wake_responses(db) == [403]
        time.sleep(0.5)
        assert db.execute("select status, attempts from pgqueue.all_jobs").fetchall() == [
            ("queued", 0)
        ]

        # The sweeper's wake-up with the right secret, caught on its way: changed, refused;
        # as sent, taken, and the job runs; sent again, refused.
        with HttpSink() as sink:
            point_wake_ups(db, sink.url, worker.wake_secret)
            db.execute("select pgqueue.sweep()")
            wait_for_pg_net(db)
        (real,) = sink.requests
        headers = {k: v for k, v in real.headers.items() if k.startswith("webhook-")}
        changed = real.body.replace(b"default", b"elsewhere")
        assert httpx.post(worker.url, headers=headers, content=changed).status_code == 403
        assert httpx.post(worker.url, headers=headers, content=real.body).status_code == 202
        wait_for_jobs(db, "status = 'done'", worker)
        assert httpx.post(worker.url, headers=headers, content=real.body).status_code == 403

        (logged,) = [e for e in worker.events() if e.get("event") == "wake.refused"]
        assert "PGQUEUE_WAKE_SECRET" in logged["check"] and "clock" in logged["check"]
        assert worker.wake_secret not in worker.output()
    finally:
        stop_edge_worker(worker)


def test_a_job_is_completed_by_the_call_that_claims_the_next_one(
    db: psycopg.Connection,
    deno: Deno,
    function_dir: Path,
    postgrest: PostgRESTStandIn,
) -> None:
    # One job per claim; the second takes a while at a slow receiver, so it is still running
    # when the test looks. Under the Edge runtime's waitUntil, the function ends as soon as
    # its work is over.
    worker = start_edge_worker(
        deno,
        function_dir,
        postgrest,
        edge_runtime=True,
        PGQUEUE_BATCH_SIZE="1",
        PGQUEUE_LINGER_MS="0",
    )
    try:
        with SlowReceiver(delay=1.0) as slow:
            point_wakeups_at(db, worker)
            first, second = insert_jobs(
                db,
                {"kind": "send_email", "payload": {"to": "a@b.co", "subject": "Hi", "text": ""}},
                {"kind": "send_webhook", "payload": {"url": slow.url}},
            )
            wait_for_jobs(db, f"id <> {second} or status = 'running'", worker)
            # The first job's done_batches row and the second job's claim were written by one
            # transaction: the call that completed the one claimed the other.
            same = db.execute(
                "select b.xmin = c.xmin, b.finished_at = c.locked_at"
                " from pgqueue.done_batches as b, pgqueue.claims as c"
                " where %s = any (b.ids) and %s = any (c.ids)",
                (first, second),
            ).fetchone()
            assert same == (True, True)
            assert worker.wait_for_exit() == 0
    finally:
        stop_edge_worker(worker)

    # The second job had no next job to ride along with: the claim that found the queue empty
    # completed it, before the function's work was over and the runtime ended it.
    statuses = db.execute("select id, status from pgqueue.all_jobs order by id").fetchall()
    assert statuses == [(first, "done"), (second, "done")]
    [summary] = [e for e in worker.events() if e["event"] == "drain.end"]
    assert (summary["claimed"], summary["completed"], summary["stoppedBy"]) == (2, 2, "empty")
    assert worker.events()[-1]["event"] == "edge_runtime.shutdown"


def test_the_function_stops_claiming_when_its_time_budget_runs_out(
    db: psycopg.Connection,
    deno: Deno,
    function_dir: Path,
    postgrest: PostgRESTStandIn,
) -> None:
    # One job per claim, each taking ~0.4 s at a slow receiver, and a 1 s budget: the
    # function stops after a few batches and leaves the rest for the next wake-up. Under the
    # Edge runtime's waitUntil, it ends as soon as its work is over.
    worker = start_edge_worker(
        deno,
        function_dir,
        postgrest,
        edge_runtime=True,
        PGQUEUE_BATCH_SIZE="1",
        PGQUEUE_TIME_BUDGET_SECONDS="1",
    )
    try:
        with SlowReceiver(delay=0.4) as slow:
            point_wakeups_at(db, worker)
            insert_jobs(
                db, *[{"kind": "send_webhook", "payload": {"url": slow.url}} for _ in range(10)]
            )
            assert worker.wait_for_exit() == 0
    finally:
        stop_edge_worker(worker)

    [summary] = [e for e in worker.events() if e["event"] == "drain.end"]
    assert summary["stoppedBy"] == "time budget"
    assert 1 <= summary["completed"] <= 3
    assert summary["elapsedMs"] < 2000
    assert slow.hits == summary["completed"]
    # The wake-up was answered at once, not after the batch: before the last job was done.
    answered_early = db.execute(
        "select (select created from net._http_response where status_code = 202)"
        " < (select max(finished_at) from pgqueue.all_jobs)"
    ).fetchone()[0]
    assert answered_early is True
    # No job is left running: the last batch, which no claim followed, was completed on its
    # own before the function's work was over.
    counts = dict(db.execute("select status, count(*) from pgqueue.all_jobs group by 1").fetchall())
    assert counts == {"done": summary["completed"], "queued": 10 - summary["completed"]}
