"""Worker processes of each Python variant against the stack: jobs enqueued in SQL, wake-ups
through pg_net (HTTP) or NOTIFY (postgres), failures, crashes and shutdowns."""

from __future__ import annotations

import json
import signal
import time
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import psycopg
import pytest

from testkit.postgrest import make_jwt
from testkit.project import PYTHON_VARIANTS, variant
from testkit.stack import wait_for_pg_net
from tests.support.jobs import enqueue, job, job_by_id, runs, wait_until
from tests.support.wake_signing import post_wake, secret_for, signed
from tests.support.workers import (
    OTHER_KIND,
    Installed,
    Workers,
    each_transport,
    other_service,
    wake_to,
)


def sweeper(db: psycopg.Connection):
    """What pg_cron does every minute, on demand: rescue expired leases, re-wake workers."""
    return lambda: db.execute("select pgqueue.sweep()")


def log_events(output: str) -> list[dict]:
    """The event and job id of each of a worker's JSON log lines."""
    lines = (json.loads(line) for line in output.splitlines() if line.startswith("{"))
    return [{"event": e.get("event"), "job_id": e.get("job_id")} for e in lines]


def until_status(db: psycopg.Connection, job_id: int, status: str, **kw) -> dict:
    return wait_until(
        lambda: (row := job(db, job_id))["status"] == status and row,
        what=f"job {job_id} to be {status}",
        **kw,
    )


@pytest.mark.quick
def test_job_enqueued_with_a_domain_row_runs_once(
    installed: Installed,
    workers: Workers,
    db: psycopg.Connection,
    wake_secret: str,
    tmp_path: Path,
) -> None:
    worker = workers.start_woken(db, wake_secret)
    db.execute("create table if not exists public.e2e_orders (id serial primary key, note text)")
    log = tmp_path / "runs.jsonl"
    # the pattern the README shows: the job commits (or rolls back) with the row it is about
    with db.transaction():
        db.execute("insert into public.e2e_orders (note) values ('first')")
        job_id = enqueue(db, log=str(log))

    done = until_status(db, job_id, "done")
    assert done["attempts"] == 1
    time.sleep(0.5)
    assert runs(log, job_id) == [(1, "start"), (1, "end")]
    if not installed.http:  # (python-http serves uvicorn through the same run_until_complete)
        [started] = worker.events("worker.start")
        assert started["event_loop"] == "uvloop"
    if installed.http:
        wait_for_pg_net(db)
        codes = [r[0] for r in db.execute("select status_code from net._http_response")]
        assert codes == [202]
    assert worker.proc.poll() is None


@each_transport
def test_two_services_on_one_queue_each_run_only_their_own_kinds(
    installed: Installed, workers: Workers, db: psycopg.Connection, tmp_path: Path
) -> None:
    """Two services share the default queue: this project (the probe and the example
    handlers) and another one that handles only OTHER_KIND. Each claims only its own kinds, so
    every job runs once, on the service that handles it, and nothing fails or is
    dead-lettered; a job of a kind neither handles waits untouched."""
    ours = workers.start(WORKER_NAME="ours")
    theirs = workers.start(src=other_service(installed, tmp_path), WORKER_NAME="theirs")
    log = tmp_path / "runs.jsonl"
    with db.transaction():  # mixed in one batch, so each worker is offered the other's jobs
        jobs = {
            job_id: expected
            for _ in range(10)
            for job_id, expected in (
                (enqueue(db, log=str(log)), "ours"),
                (enqueue(db, kind=OTHER_KIND, log=str(log)), "theirs"),
            )
        }
        nobodys = enqueue(db, kind="nobodys")

    for job_id in jobs:
        done = until_status(db, job_id, "done")
        assert (done["attempts"], done["last_error"]) == (1, None)
        assert runs(log, job_id) == [(1, "start"), (1, "end")]

    def ran_by() -> dict[int, str]:
        """The worker that logged each job done (a finished job keeps no locked_by)."""
        services = {"ours": ours, "theirs": theirs}
        return {e["job_id"]: name for name, w in services.items() for e in w.events("job.done")}

    wait_until(lambda: len(ran_by()) == len(jobs), what="each job's worker to log it done")
    assert ran_by() == jobs
    waiting = job(db, nobodys)
    assert (waiting["status"], waiting["attempts"], waiting["last_error"]) == ("queued", 0, None)
    assert db.execute("select count(*) from pgqueue.dead_letters").fetchone() == (0,)
    [started] = theirs.events("worker.start")
    assert started["kinds"] == [OTHER_KIND]
    assert OTHER_KIND not in ours.events("worker.start")[0]["kinds"]
    assert ours.proc.poll() is None and theirs.proc.poll() is None


@pytest.mark.parametrize("installed", [variant("python", "postgres")], indirect=True, ids=str)
def test_notify_wakes_an_idle_worker(
    installed: Installed, workers: Workers, db: psycopg.Connection, tmp_path: Path
) -> None:
    # Polls back off to a minute: only the NOTIFY can bring the worker in within a second.
    worker = workers.start(WORKER_POLL_INTERVAL=60)
    time.sleep(3.5)  # the next poll is now ~3 s away
    log = tmp_path / "runs.jsonl"
    enqueued = time.monotonic()
    job_id = enqueue(db, log=str(log))
    wait_until(lambda: runs(log, job_id), timeout=1.5, what="the job to start", interval=0.01)
    latency = time.monotonic() - enqueued
    until_status(db, job_id, "done", timeout=2)
    assert latency < 1.0
    assert worker.proc.poll() is None


@pytest.mark.parametrize(
    "installed",
    [v for v in PYTHON_VARIANTS if v.claim_transport == "postgres"],
    indirect=True,
    ids=str,
)
def test_worker_reconnects_after_losing_its_connections(
    installed: Installed,
    workers: Workers,
    db: psycopg.Connection,
    wake_secret: str,
    tmp_path: Path,
) -> None:
    worker = workers.start_woken(db, wake_secret, WORKER_POLL_INTERVAL=60)
    log = tmp_path / "runs.jsonl"
    until_status(db, enqueue(db, log=str(log)), "done")  # connected and working
    killed = db.execute(
        "select count(pg_terminate_backend(pid)) from pg_stat_activity"
        " where application_name = 'my-app-worker'"
    ).fetchone()
    assert killed is not None and killed[0] >= 1
    time.sleep(1)  # the listener notices and reconnects
    until_status(db, enqueue(db, log=str(log)), "done", timeout=10)
    assert worker.proc.poll() is None


def test_failures_are_retried_dead_lettered_and_the_worker_goes_on(
    installed: Installed,
    workers: Workers,
    db: psycopg.Connection,
    wake_secret: str,
    tmp_path: Path,
) -> None:
    worker = workers.start_woken(db, wake_secret)
    log = tmp_path / "runs.jsonl"
    raising = enqueue(db, log=str(log), error="boom", max_attempts=2)
    invalid = enqueue(db, log=42, sleep="long")

    first = wait_until(
        lambda: (row := job(db, raising))["attempts"] == 1 and row["status"] == "queued" and row,
        what="the first failure",
    )
    # the error on the first line, then the handler's traceback down to its raise (issue 50:
    # a new user's `KeyError: 'STRIPE_KEY'` said nowhere where it came from)
    summary, *trace = first["last_error"].splitlines()
    assert summary == "RuntimeError: boom"
    assert trace[0] == "Traceback (most recent call last):", first["last_error"]
    assert "e2e_probe" in "\n".join(trace) and trace[-1] == "RuntimeError: boom", trace
    # backoff after attempt 1: 2.5 to 5 s from the failure (locked_at is the claim's time)
    assert first["run_after"] - first["locked_at"] >= timedelta(seconds=2.4)

    bad = until_status(db, invalid, "failed")
    assert bad["attempts"] == 1
    assert bad["last_error"].startswith("invalid payload for 'e2e_probe': log: Input should be")
    assert "sleep: Input should be a valid number" in bad["last_error"]

    dead = until_status(db, raising, "failed", timeout=15, tick=sweeper(db), interval=0.3)
    assert (dead["attempts"], dead["last_error"].splitlines()[0]) == (2, "RuntimeError: boom")
    assert runs(log, raising) == [(1, "start"), (2, "start")]
    dead_letters = {r[0] for r in db.execute("select id from pgqueue.dead_letters")}
    assert dead_letters == {raising, invalid}

    after = enqueue(db, log=str(log))
    until_status(db, after, "done", tick=sweeper(db), interval=0.2)
    assert worker.proc.poll() is None


def test_a_handler_chooses_its_retry_delay_and_a_kind_its_own_backoff(
    installed: Installed,
    workers: Workers,
    db: psycopg.Connection,
    wake_secret: str,
    tmp_path: Path,
) -> None:
    """RetryAfter(300) and a kind's Backoff(base=120, jitter=0) reach fail()'s retry_in: each
    job's next attempt is that far from its failure (the time its attempt's error was kept,
    in fail()'s transaction), not the database's 2.5 to 5 s."""
    workers.start_woken(db, wake_secret)
    log = tmp_path / "runs.jsonl"
    chosen = enqueue(db, log=str(log), retry_after=300)
    own_backoff = enqueue(db, "e2e_probe_backoff", log=str(log), error="boom")
    default = enqueue(db, log=str(log), error="boom")

    def failed_once(job_id: int) -> dict:
        wait_until(
            lambda: (row := job(db, job_id))["attempts"] == 1 and row["last_error"] and row,
            what=f"job {job_id} to fail once",
        )
        # (not run_after - now(): a reader's now() may come before the failure it then sees)
        row = job_by_id(db, job_id)
        [error] = row["errors"]
        return row | {"delay": row["run_after"] - datetime.fromisoformat(error["at"])}

    retried = failed_once(chosen)
    assert retried["last_error"] == "RetryAfter: the API said: retry later"
    assert retried["status"] == "queued"
    assert retried["delay"] == timedelta(seconds=300)
    backed_off = failed_once(own_backoff)
    assert backed_off["status"] == "queued"
    assert backed_off["last_error"].splitlines()[0] == "RuntimeError: boom"
    assert backed_off["delay"] == timedelta(seconds=120)
    assert timedelta(seconds=2.5) <= failed_once(default)["delay"] <= timedelta(seconds=5)


def test_a_quick_job_is_recorded_done_while_long_ones_hold_the_other_slots(
    installed: Installed,
    workers: Workers,
    db: psycopg.Connection,
    wake_secret: str,
    tmp_path: Path,
) -> None:
    """Four slots, and three long jobs and a quick one in the first claim: no claim follows
    the quick job (the next one waits for two free slots), yet its success is recorded at
    once, sent on its own, while the long jobs run. Theirs ride along with the next claim."""
    worker = workers.start_woken(db, wake_secret, WORKER_BATCH_SIZE=4)
    log = tmp_path / "runs.jsonl"
    with db.transaction():  # one wake-up, one claim
        long = [enqueue(db, log=str(log), sleep=4) for _ in range(3)]
        quick = enqueue(db, log=str(log))

    until_status(db, quick, "done", timeout=2)
    assert {job(db, i)["status"] for i in long} == {"running"}
    for i in long:
        until_status(db, i, "done")
    assert worker.proc.poll() is None


def test_jobs_of_a_killed_worker_complete_on_another_after_the_sweep(
    installed: Installed,
    workers: Workers,
    db: psycopg.Connection,
    wake_secret: str,
    tmp_path: Path,
) -> None:
    first = workers.start_woken(db, wake_secret, WORKER_LEASE_SECONDS=1)
    log = tmp_path / "runs.jsonl"
    # One commit: the first worker gets them all in its first claim. (Enqueued one by one,
    # the python-http worker would take the first and then wait for it, 60 s, before it
    # looks again: wake-ups that come while it drains are kept for after.)
    with db.transaction():
        ids = [enqueue(db, log=str(log), sleep=60, sleep_first_attempt_only=True) for _ in range(3)]
    wait_until(lambda: all(runs(log, i) for i in ids), what="all jobs to start")
    second = workers.start(WORKER_LEASE_SECONDS=1)
    first.proc.kill()  # SIGKILL: no chance to release anything
    first.wait()
    assert {job(db, i)["status"] for i in ids} == {"running"}
    rescues = "select value from pgqueue.counters where name = 'lease_rescues'"
    (rescued_before,) = db.execute(rescues).fetchone()

    if installed.http:
        wake_to(db, second, wake_secret)
    # rescued by a sweep, each back in its place in the queue and run again at once
    for i in ids:
        until_status(db, i, "done", timeout=20, tick=sweeper(db), interval=0.3)
    assert db.execute(rescues).fetchone() == (rescued_before + 3,)
    for i in ids:
        assert job(db, i)["attempts"] == 2
        assert runs(log, i) == [(1, "start"), (2, "start"), (2, "end")]


def test_sigterm_lets_running_jobs_finish_and_exits_0(
    installed: Installed,
    workers: Workers,
    db: psycopg.Connection,
    wake_secret: str,
    tmp_path: Path,
) -> None:
    worker = workers.start_woken(db, wake_secret)
    log = tmp_path / "runs.jsonl"
    ids = [enqueue(db, log=str(log), sleep=1.5) for _ in range(2)]
    wait_until(lambda: all(runs(log, i) for i in ids), what="both jobs to start")
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output()
    for i in ids:
        assert job(db, i)["status"] == "done"
        assert runs(log, i) == [(1, "start"), (1, "end")]


def test_sigterm_releases_jobs_that_outlast_the_grace_period(
    installed: Installed,
    workers: Workers,
    db: psycopg.Connection,
    wake_secret: str,
    tmp_path: Path,
) -> None:
    worker = workers.start_woken(db, wake_secret, WORKER_SHUTDOWN_GRACE=0.5)
    log = tmp_path / "runs.jsonl"
    job_id = enqueue(db, log=str(log), sleep=60)
    wait_until(lambda: runs(log, job_id), what="the job to start")
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=15) == 0, worker.output()
    released = job(db, job_id)
    assert (released["status"], released["attempts"], released["lock_token"]) == ("queued", 0, None)
    assert released["due_in"] <= timedelta(0)  # runnable again at once


@pytest.mark.parametrize(
    "installed",
    [v for v in PYTHON_VARIANTS if v.http],
    indirect=True,
    ids=str,
)
def test_wake_endpoint_refuses_what_the_database_did_not_sign(
    installed: Installed,
    workers: Workers,
    db: psycopg.Connection,
    wake_secret: str,
    service_role_key: str,
    tmp_path: Path,
) -> None:
    # no idle poll and no linger during the test: only a wake-up can bring the worker in
    worker = workers.start(WORKER_POLL_INTERVAL=3600, WORKER_LINGER_SECONDS=0)
    log = tmp_path / "runs.jsonl"
    job_id = enqueue(db, log=str(log))  # no wake-up configured: only our POSTs can wake it
    body = json.dumps({"queues": ["default"]}).encode()
    refused = [
        ({}, 401),
        # the secret itself, as 1.1.0 sent it, opens nothing
        ({"Authorization": f"Bearer {wake_secret}"}, 401),
        ({"Authorization": f"Bearer {make_jwt('anon')}"}, 401),
        # signed with the service key, which opens the Data API, never the wake endpoint
        (signed(secret_for(service_role_key), body), 403),
    ]
    for headers, status in refused:
        response = httpx.post(f"{worker.url}/wake", headers=headers, content=body)
        assert response.status_code == status, headers
    time.sleep(0.5)
    untouched = job(db, job_id)
    assert (untouched["status"], untouched["attempts"]) == ("queued", 0)
    assert runs(log, job_id) == []

    assert post_wake(f"{worker.url}/wake", wake_secret).status_code == 202
    until_status(db, job_id, "done")


def test_heartbeats_keep_a_claim_leased_and_stop_only_a_cancelled_job(
    installed: Installed,
    workers: Workers,
    db: psycopg.Connection,
    wake_secret: str,
    tmp_path: Path,
) -> None:
    worker = workers.start_woken(db, wake_secret, WORKER_LEASE_SECONDS=2)
    log = tmp_path / "runs.jsonl"
    with db.transaction():  # one claim takes all three
        kept = [enqueue(db, log=str(log), sleep=3.5) for _ in range(2)]
        cancelled = enqueue(db, log=str(log), sleep=30)
    wait_until(lambda: job(db, cancelled)["status"] == "running", what="the jobs to run")
    (claims,) = db.execute("select count(*) from pgqueue.claims").fetchone()
    assert claims == 1, "the three jobs share one claim, so one lease"
    db.execute("select pgqueue.cancel(%s)", (cancelled,))
    # the sweeper runs all along: without heartbeats it would rescue the jobs after 2 s
    for job_id in kept:
        done = until_status(db, job_id, "done", timeout=15, tick=sweeper(db), interval=0.2)
        assert done["attempts"] == 1, (done["last_error"], worker.output()[-4000:])
        assert runs(log, job_id) == [(1, "start"), (1, "end")]
    # The cancelled job's next renewal left it out: the worker stopped its handler.
    assert job(db, cancelled)["status"] == "cancelled"
    assert runs(log, cancelled) == [(1, "start")]
    wait_until(
        lambda: {"event": "job.lost", "job_id": cancelled} in log_events(worker.output()),
        what="the worker to stop the cancelled job",
    )


def test_a_payload_too_deep_to_decode_fails_its_own_job_only(
    installed: Installed,
    workers: Workers,
    db: psycopg.Connection,
    wake_secret: str,
    tmp_path: Path,
) -> None:
    """jsonb keeps 5,000 levels of nesting; Python's json module stops near 1,000. Claimed in
    the same batch as good jobs, the deep one must fail alone, with the reason stored (over
    the Data API too: claim's payload comes as text and is decoded job by job)."""
    worker = workers.start_woken(db, wake_secret, WORKER_BATCH_SIZE=10)
    log = tmp_path / "runs.jsonl"
    depth = 5_000
    with db.transaction():  # one wake-up, one batch: the deep job and its neighbours
        good = [enqueue(db, log=str(log)) for _ in range(3)]
        row = db.execute(
            "select pgqueue.enqueue('e2e_probe', %s::jsonb)",
            (f'{{"log": "{log}", "deep": {"[" * depth}{"]" * depth}}}',),
        ).fetchone()
        good += [enqueue(db, log=str(log)) for _ in range(3)]
    assert row is not None
    deep = row[0]

    def state() -> tuple[str, int, str | None]:
        # not select *: the test's own psycopg could not decode this payload either
        found = db.execute(
            "select status, attempts, last_error from pgqueue.all_jobs where id = %s", (deep,)
        ).fetchone()
        assert found is not None
        return found

    _, attempts, error = wait_until(
        lambda: (s := state())[0] == "failed" and s, what="the deep job to fail"
    )
    assert attempts == 1
    assert error == (
        "invalid payload for 'e2e_probe': nested too deeply to decode "
        "(Python's json stops near 1,000 levels)"
    )
    for i in good:
        until_status(db, i, "done")
    assert runs(log, deep) == []
    assert worker.proc.poll() is None


@pytest.mark.parametrize(
    "installed", [v for v in PYTHON_VARIANTS if v.http], indirect=True, ids=str
)
def test_a_job_claimed_while_lingering_keeps_its_lease(
    installed: Installed,
    workers: Workers,
    db: psycopg.Connection,
    wake_secret: str,
    tmp_path: Path,
) -> None:
    """After a wake-up the app lingers; a long job it finds then is heartbeaten like any other."""
    worker = workers.start(
        WORKER_LEASE_SECONDS=2, WORKER_POLL_INTERVAL=3600, WORKER_LINGER_SECONDS=10
    )
    assert post_wake(f"{worker.url}/wake", wake_secret, {}).status_code == 202
    time.sleep(0.5)  # the queue was empty: the app lingers now, and no wake-up is configured
    log = tmp_path / "runs.jsonl"
    job_id = enqueue(db, log=str(log), sleep=3.5)
    done = until_status(db, job_id, "done", timeout=15, tick=sweeper(db), interval=0.2)
    assert done["attempts"] == 1, (done["last_error"], worker.output()[-4000:])
    assert runs(log, job_id) == [(1, "start"), (1, "end")]
