"""A call that ends a running job while the sweeper rescues the same job (its lease expired):
the call waits for the sweep's transaction, and must then act on the job where the sweep put
it, not report that there was nothing to do while the job goes on (issue 38, finding 5).

Each test holds a sweep open in a transaction of its own (the claim row locked, the job
requeued but not yet committed), starts the call on another connection, where it waits, then
commits the sweep."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from testkit.cluster import Cluster
from tests.sql.test_hot_path import complete_and_claim


def running_job(db: psycopg.Connection, max_attempts: int = 5) -> tuple[int, str]:
    """A job claimed by a worker whose lease has run out."""
    (job_id,) = db.execute(
        "select pgqueue.enqueue('race.probe', max_attempts => %s)", (max_attempts,)
    ).fetchone()
    (token,) = db.execute(
        "select lock_token::text from pgqueue.claim('late-worker', kinds => array['race.probe'])"
    ).fetchone()
    db.execute(
        "update pgqueue.claims set locked_until = now() - interval '1 second'"
        " where lock_token = %s",
        (token,),
    )
    return job_id, token


def during_a_sweep(stack: Cluster, call: Callable[[psycopg.Connection], Any]) -> Any:
    """Runs `call` on a connection of its own while a sweep that has rescued the job is still
    uncommitted; commits the sweep once the call waits on it. Returns what `call` returned."""
    result: dict[str, Any] = {}
    with stack.connect() as sweeper, stack.connect(autocommit=True) as caller:
        (rescued,) = sweeper.execute(
            "select rescued + dead_lettered from pgqueue.sweep()"
        ).fetchone()
        assert rescued == 1, "the sweep rescued the job (and holds it, uncommitted)"
        pid = caller.info.backend_pid

        def run() -> None:
            try:
                result["value"] = call(caller)
            except Exception as exc:  # surfaced below, in the test's thread
                result["error"] = exc

        thread = threading.Thread(target=run)
        thread.start()
        with stack.connect(autocommit=True) as watcher:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                (waiting,) = watcher.execute(
                    "select wait_event_type = 'Lock' from pg_stat_activity where pid = %s", (pid,)
                ).fetchone()
                if waiting:
                    break
                time.sleep(0.01)
            assert waiting, "the call waits on the sweep's lock"
        sweeper.commit()
        thread.join(10)
        assert not thread.is_alive()
    if "error" in result:
        raise result["error"]
    return result["value"]


def where_is(db: psycopg.Connection, job_id: int) -> tuple[str, int] | None:
    return db.execute(
        "select status, attempts from pgqueue.all_jobs where id = %s", (job_id,)
    ).fetchone()


def assert_queued_counts_match(db: psycopg.Connection, queued: int) -> None:
    """The gauges' counts (queued_counts) agree with the jobs: the sweep counted the job it
    requeued, and the call that took it back from the queue uncounted it."""
    (direct, counted) = db.execute(
        "select (select count(*) from pgqueue.live_jobs where status = 'queued'),"
        " (select coalesce(sum(jobs), 0) from pgqueue.queued_counts)"
    ).fetchone()
    assert (direct, counted) == (queued, queued)


def test_cancel_that_waited_on_a_sweep_cancels_the_job_the_sweep_requeued(
    stack: Cluster, db: psycopg.Connection
) -> None:
    job_id, _ = running_job(db)
    cancelled = during_a_sweep(
        stack, lambda c: c.execute("select pgqueue.cancel(%s)", (job_id,)).fetchone()[0]
    )
    assert cancelled is True
    assert where_is(db, job_id) == ("cancelled", 1)
    assert db.execute("select count(*) from pgqueue.jobs").fetchone() == (0,)
    assert_queued_counts_match(db, 0)


def test_fail_that_waited_on_a_sweep_records_the_workers_error_and_outcome(
    stack: Cluster, db: psycopg.Connection
) -> None:
    """The worker said the job can never succeed; the sweep had put it back in the queue for
    another attempt. The worker's word wins: dead-lettered, with its error."""
    job_id, token = running_job(db)
    status = during_a_sweep(
        stack,
        lambda c: c.execute(
            "select pgqueue.fail(%s, %s, 'invalid payload', retryable => false)", (job_id, token)
        ).fetchone()[0],
    )
    assert status == "failed"
    assert where_is(db, job_id) == ("failed", 1)
    (error,) = db.execute(
        "select last_error from pgqueue.job_history where id = %s", (job_id,)
    ).fetchone()
    assert error == "invalid payload"
    assert_queued_counts_match(db, 0)


def test_retryable_fail_that_waited_on_a_sweep_keeps_the_job_queued_with_the_workers_error(
    stack: Cluster, db: psycopg.Connection
) -> None:
    job_id, token = running_job(db)
    status = during_a_sweep(
        stack,
        lambda c: c.execute(
            "select pgqueue.fail(%s, %s, 'upstream timed out')", (job_id, token)
        ).fetchone()[0],
    )
    assert status == "queued"
    assert where_is(db, job_id) == ("queued", 1)
    (error,) = db.execute("select last_error from pgqueue.jobs where id = %s", (job_id,)).fetchone()
    assert error == "upstream timed out"
    # the attempt's one error is the worker's, not the sweep's guess (its lease expired)
    (errors,) = db.execute("select errors from pgqueue.job(%s)", (job_id,)).fetchone()
    assert [(e["attempt"], e["message"]) for e in errors] == [(1, "upstream timed out")]
    assert_queued_counts_match(db, 1)


def test_release_that_waited_on_a_sweep_hands_the_job_back_uncounted_and_due_now(
    stack: Cluster, db: psycopg.Connection
) -> None:
    job_id, token = running_job(db)
    released = during_a_sweep(
        stack,
        lambda c: c.execute("select pgqueue.release(%s, %s)", (job_id, token)).fetchone()[0],
    )
    assert released is True
    assert where_is(db, job_id) == ("queued", 0)
    assert db.execute("select errors from pgqueue.job(%s)", (job_id,)).fetchone() == ([],)
    (due,) = db.execute(
        "select run_after <= now() from pgqueue.jobs where id = %s", (job_id,)
    ).fetchone()
    assert due
    assert_queued_counts_match(db, 1)


def test_a_late_call_after_the_job_was_claimed_again_is_still_refused(
    stack: Cluster, db: psycopg.Connection
) -> None:
    """What the race fix must not do: act on a job another worker now runs. A fail() under a
    token whose attempt the sweeper ended, after the job was claimed again, changes nothing."""
    job_id, token = running_job(db)
    db.execute("select pgqueue.sweep()")
    db.execute("update pgqueue.jobs set run_after = now() where id = %s", (job_id,))
    (new_token,) = db.execute(
        "select lock_token::text from pgqueue.claim('next-worker', kinds => array['race.probe'])"
    ).fetchone()
    assert new_token != token
    status = db.execute(
        "select pgqueue.fail(%s, %s, 'too late', retryable => false)", (job_id, token)
    ).fetchone()[0]
    assert status is None
    assert where_is(db, job_id) == ("running", 2)


def test_sweeps_and_keyed_claims_never_deadlock_and_lose_nothing(
    flow: psycopg.Connection, stack: Cluster
) -> None:
    """Workers drain keyed jobs (12 keys, limit 2) through complete_and_claim() while another
    connection sweeps every 0.2 s for 20 s, and a worker that dies now and then leaves claims
    whose 1 s lease the sweeps rescue. The claims delete the stale running_keys rows of each key
    they visit, the sweep those of every key: neither may wait on the other in a cycle (issue
    48: 4 deadlocks in 60 s, each rolling back a sweep's rescues). Nothing is lost or done
    twice, and the counters and counts agree with what the sweeps returned."""
    db = flow
    keys = [f"tenant-{i}" for i in range(12)]
    for key in keys:
        db.execute("select pgqueue.set_concurrency_limit(%s, 2)", (key,))
    jobs = [
        {"kind": "k", "concurrency_key": keys[i % 12], "payload": {"n": i}, "max_attempts": 100}
        for i in range(60_000)
    ]
    # the dying worker's jobs, under keys of their own (limit 2 too), so that however busy the
    # machine, the workers never hold every slot it could claim
    dying_keys = [f"dying-{i}" for i in range(4)]
    for key in dying_keys:
        db.execute("select pgqueue.set_concurrency_limit(%s, 2)", (key,))
    jobs += [
        {
            "kind": "d",
            "concurrency_key": dying_keys[i % 4],
            "payload": {"n": i},
            "max_attempts": 100,
        }
        for i in range(2_000)
    ]
    ids = [r[0] for r in db.execute("select pgqueue.enqueue_many(%s)", (Jsonb(jobs),))]
    (rescues_before,) = db.execute(
        "select value from pgqueue.counters where name = 'lease_rescues'"
    ).fetchone()

    errors: list[str] = []  # "who: SQLSTATE message" of every call that failed
    completed: Counter[int] = Counter()
    swept = Counter[str]()
    lock = threading.Lock()
    stop = threading.Event()

    def failed(who: str, exc: psycopg.Error) -> None:
        with lock:
            errors.append(f"{who}: {exc.sqlstate} {exc}")

    def worker(name: str) -> None:
        with stack.connect(autocommit=True) as conn:
            batch: list[dict] = []
            while True:
                try:
                    nxt = complete_and_claim(
                        conn, batch, max_jobs=0 if stop.is_set() else 10, kinds=["k"]
                    )
                except psycopg.Error as exc:
                    failed(name, exc)
                    continue  # nothing of the call happened: complete the same batch again
                with lock:
                    completed.update(j["id"] for j in batch)
                batch = nxt
                if stop.is_set():
                    return

    def dying_worker() -> None:
        with stack.connect(autocommit=True) as conn:
            while not stop.wait(0.5):
                try:
                    complete_and_claim(conn, max_jobs=4, lease_seconds=1, kinds=["d"])
                except psycopg.Error as exc:
                    failed("dying worker", exc)

    def sweeper() -> None:
        with stack.connect(autocommit=True) as conn:
            while not stop.wait(0.2):
                try:
                    rescued, dead = conn.execute(
                        "select rescued, dead_lettered from pgqueue.sweep()"
                    ).fetchone()
                except psycopg.Error as exc:
                    failed("sweep", exc)
                    continue
                with lock:
                    swept.update(rescued=rescued, dead_lettered=dead, sweeps=1)

    threads = [threading.Thread(target=worker, args=(f"worker {i}",)) for i in range(4)]
    threads += [threading.Thread(target=dying_worker), threading.Thread(target=sweeper)]
    for thread in threads:
        thread.start()
    time.sleep(20)
    stop.set()
    for thread in threads:
        thread.join(60)
        assert not thread.is_alive()

    print(
        f"[sweeps beside keyed claims] {swept['sweeps']} sweeps, {swept['rescued']} rescued,"
        f" {len(completed)} done, {len(errors)} calls failed"
    )
    deadlocks = [e for e in errors if ": 40P01 " in e]
    assert not deadlocks, f"{len(deadlocks)} deadlocks: {deadlocks[:3]}"
    assert not errors
    assert swept["sweeps"] >= 20 and swept["rescued"] > 0, "the sweeps ran, and rescued jobs"
    assert completed and set(completed.values()) == {1}, "no job done twice"
    # What the dying worker still holds goes back too; then every job is done or queued, once.
    db.execute("update pgqueue.claims set locked_until = now() - interval '1 second'")
    (rescued,) = db.execute("select rescued from pgqueue.sweep()").fetchone()
    swept.update(rescued=rescued)
    where = dict(db.execute("select id, status from pgqueue.all_jobs").fetchall())
    assert sorted(where) == sorted(ids), "no job lost"
    assert {i for i, status in where.items() if status == "done"} == set(completed)
    assert set(where.values()) == {"done", "queued"}
    (rescues_after,) = db.execute(
        "select value from pgqueue.counters where name = 'lease_rescues'"
    ).fetchone()
    assert rescues_after - rescues_before == swept["rescued"]
    assert_queued_counts_match(db, len(ids) - len(completed))
