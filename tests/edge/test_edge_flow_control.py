"""End to end, issue 17's flow control and results with the Edge Function: the function (a
copy of the rendered one with the `probe` job kind, under `deno run`) stores what a handler
returns as its job's result, lets a running handler report progress, fails a job whose result
is too large and goes on, claims nothing from a paused queue, and keeps a concurrency key's
limit while two instances claim; and its queue client (queue.ts) calls each function of the
SQL contract through the PostgREST stand-in."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.types.json import Jsonb

from testkit.cluster import Cluster
from testkit.postgrest import PostgRESTStandIn
from testkit.stack import point_wake_ups
from tests.support.jobs import job_by_id, running_of_key

from .deno_worker import (
    Deno,
    EdgeWorker,
    run_queue_client,
    start_edge_worker,
    stop_edge_worker,
)
from .test_edge_linger import summaries, wait_for_summaries, wake
from .test_edge_worker import point_wakeups_at, wait_for_jobs

TOO_BIG_TAIL = (
    "(max_result_bytes): return less, or store it elsewhere (e.g. Supabase Storage) and "
    "return a reference"
)


@pytest.fixture(scope="module")
def probe_worker(
    deno: Deno, probe_function_dir: Path, postgrest: PostgRESTStandIn
) -> Iterator[EdgeWorker]:
    """The function with the probe kind: three jobs a claim, and no linger, so each wake-up
    ends when its queues are empty."""
    worker = start_edge_worker(
        deno, probe_function_dir, postgrest, PGQUEUE_LINGER_MS="0", PGQUEUE_BATCH_SIZE="3"
    )
    yield worker
    stop_edge_worker(worker)


def enqueue_probes(
    db: psycopg.Connection, *payloads: dict, concurrency_key: str | None = None
) -> list[int]:
    """One INSERT statement (so one wake-up) of a probe job per payload; their ids, in order."""
    rows = db.execute(
        """
        insert into pgqueue.jobs (kind, payload, concurrency_key)
        select 'probe', p.payload, %s
        from jsonb_array_elements(%s) with ordinality as p(payload, n)
        order by p.n
        returning id
        """,
        (concurrency_key, Jsonb(list(payloads))),
    ).fetchall()
    return sorted(r[0] for r in rows)


# -- results and progress ---------------------------------------------------------------


def test_what_a_handler_returns_is_readable_by_job_id(
    flow: psycopg.Connection,
    probe_worker: EdgeWorker,
    deno: Deno,
    probe_function_dir: Path,
    postgrest: PostgRESTStandIn,
) -> None:
    db = flow
    point_wakeups_at(db, probe_worker)
    with_result, without = enqueue_probes(db, {"result": {"rows": 12, "file": "r.csv"}}, {})

    wait_for_jobs(db, "status = 'done'", probe_worker)

    assert job_by_id(db, with_result)["result"] == {"rows": 12, "file": "r.csv"}
    assert job_by_id(db, without)["result"] is None
    # The job with a result is kept one row per job; the other went with its batch.
    assert db.execute("select id from pgqueue.job_history").fetchall() == [(with_result,)]
    # And the queue client reads it by id.
    [read] = run_queue_client(deno, probe_function_dir, postgrest, [["job", with_result]])
    assert (read["ok"]["status"], read["ok"]["result"]) == ("done", {"rows": 12, "file": "r.csv"})


def test_progress_is_readable_while_the_job_runs(
    flow: psycopg.Connection,
    probe_worker: EdgeWorker,
    deno: Deno,
    probe_function_dir: Path,
    postgrest: PostgRESTStandIn,
) -> None:
    db = flow
    point_wakeups_at(db, probe_worker)
    (job_id,) = enqueue_probes(
        db, {"progress": {"done": 1, "of": 2}, "holdMs": 3000, "result": "finished"}
    )

    deadline = time.monotonic() + 10
    while job_by_id(db, job_id)["progress"] is None:
        assert time.monotonic() < deadline, f"no progress reported:\n{probe_worker.output()}"
        time.sleep(0.02)
    running = job_by_id(db, job_id)
    assert (running["status"], running["progress"]) == ("running", {"done": 1, "of": 2})
    [read] = run_queue_client(deno, probe_function_dir, postgrest, [["job", job_id]])
    assert (read["ok"]["status"], read["ok"]["progress"]) == ("running", {"done": 1, "of": 2})

    wait_for_jobs(db, "status = 'done'", probe_worker)
    done = job_by_id(db, job_id)
    assert (done["progress"], done["result"]) == (None, "finished")


def test_a_result_too_big_fails_its_job_and_the_drain_goes_on(
    flow: psycopg.Connection, probe_worker: EdgeWorker
) -> None:
    db = flow
    point_wakeups_at(db, probe_worker)
    drains_before = len(summaries(probe_worker))
    # Three jobs a claim: the two too big come in the first batch, with a job that is fine.
    # 6,000 zeros are 12,001 bytes of JSON, which the function lets through, but some
    # 72,000 as jsonb, which the database refuses.
    first, too_long, zeros, fits, plain = enqueue_probes(
        db, {"result": 1}, {"text": 70_000}, {"zeros": 6000}, {"text": 60_000}, {}
    )

    wait_for_jobs(db, "status in ('done', 'failed')", probe_worker)

    refused = {r["id"]: r for r in map(lambda i: job_by_id(db, i), (too_long, zeros))}
    assert all((r["status"], r["attempts"]) == ("failed", 1) for r in refused.values())
    assert refused[too_long]["last_error"] == (
        f"ResultError: the handler's result is 70000 bytes of JSON; the limit is 65536 "
        f"{TOO_BIG_TAIL}"
    )
    assert refused[zeros]["last_error"].startswith(
        f"ResultError: the database refused the handler's result: the result of job {zeros} is "
    )
    assert "bytes; the limit is 65536 (max_result_bytes)" in refused[zeros]["last_error"]
    assert job_by_id(db, first)["result"] == 1
    assert len(job_by_id(db, fits)["result"]) == 59_998
    assert (job_by_id(db, plain)["status"], job_by_id(db, plain)["result"]) == ("done", None)
    # One wake-up, which ran every job and ended because the queue was empty, not on an error.
    [summary] = wait_for_summaries(probe_worker, drains_before + 1)[drains_before:]
    assert (summary["stoppedBy"], summary["completed"], summary["deadLettered"]) == (
        "empty",
        3,
        2,
    )


def test_the_function_applies_the_configured_max_result_bytes(
    flow: psycopg.Connection, probe_worker: EdgeWorker
) -> None:
    db = flow
    db.execute("""select pgqueue.configure('{"max_result_bytes": 100}')""")
    point_wakeups_at(db, probe_worker)
    small, large = enqueue_probes(db, {"result": {"ok": True}}, {"text": 101})

    wait_for_jobs(db, "status in ('done', 'failed')", probe_worker)

    assert job_by_id(db, small)["result"] == {"ok": True}
    assert job_by_id(db, large)["last_error"] == (
        f"ResultError: the handler's result is 101 bytes of JSON; the limit is 100 {TOO_BIG_TAIL}"
    )


# -- pause and concurrency limits -------------------------------------------------------


def test_a_paused_queue_is_not_claimed_by_the_function(
    flow: psycopg.Connection, probe_worker: EdgeWorker
) -> None:
    db = flow
    point_wake_ups(db, None, None)  # the test wakes the function itself
    assert db.execute("select pgqueue.pause('default')").fetchone() == (True,)
    ids = enqueue_probes(db, {}, {})
    drains_before = len(summaries(probe_worker))

    wake(probe_worker)

    [summary] = wait_for_summaries(probe_worker, drains_before + 1)[drains_before:]
    assert (summary["claimed"], summary["stoppedBy"]) == (0, "empty")
    assert [job_by_id(db, i)["status"] for i in ids] == ["queued", "queued"]
    assert db.execute("select distinct paused from pgqueue.stats").fetchall() == [(True,)]

    # resume() wakes the workers, and the jobs run.
    point_wakeups_at(db, probe_worker)
    assert db.execute("select pgqueue.resume('default')").fetchone() == (True,)
    wait_for_jobs(db, "status = 'done'", probe_worker)


def test_a_concurrency_limit_holds_across_two_function_instances(
    flow: psycopg.Connection,
    stack: Cluster,
    deno: Deno,
    probe_function_dir: Path,
    postgrest: PostgRESTStandIn,
) -> None:
    db = flow
    point_wake_ups(db, None, None)  # the test wakes each instance itself
    db.execute("select pgqueue.set_concurrency_limit('tenant-a', 3)")
    # Two jobs a claim each: together the instances could run four of the key's jobs at
    # once, one more than its limit. Each lingers, polling, while the other holds the key.
    settings = {
        "PGQUEUE_BATCH_SIZE": "2",
        "PGQUEUE_LINGER_MS": "1000",
        "PGQUEUE_LINGER_POLL_MS": "20",
        "PGQUEUE_LOG_LEVEL": "debug",  # a job.done line per job: which instance ran it
    }
    workers = [start_edge_worker(deno, probe_function_dir, postgrest, **settings) for _ in range(2)]
    try:
        ids = enqueue_probes(db, *[{"holdMs": 200}] * 12, concurrency_key="tenant-a")
        with running_of_key(stack, "tenant-a") as samples:
            for worker in workers:
                wake(worker)
            wait_for_jobs(db, "status = 'done'", workers[0], timeout=60)
    finally:
        for worker in workers:
            stop_edge_worker(worker)

    assert max(samples) == 3, f"most running at once: {max(samples)} in {len(samples)} samples"
    # Both instances ran the key's jobs, so each claim saw the other's running jobs.
    ran = [
        {e["id"] for e in worker.events() if e["event"] == "job.done"} & set(ids)
        for worker in workers
    ]
    assert all(ran), [sorted(r) for r in ran]
    assert sorted(ran[0] | ran[1]) == ids


# -- the queue client -------------------------------------------------------------------


def test_the_queue_client_calls_each_function_of_the_contract(
    flow: psycopg.Connection,
    deno: Deno,
    probe_function_dir: Path,
    postgrest: PostgRESTStandIn,
) -> None:
    db = flow
    point_wake_ups(db, None, None)

    def client(*calls: list) -> list:
        answers = run_queue_client(deno, probe_function_dir, postgrest, list(calls))
        return [a.get("ok", a) for a in answers]

    # Enqueue, with a concurrency key and the idempotency modes.
    first, replaced, kept, many = client(
        ["enqueue", "probe", {"v": 1}, {"idempotencyKey": "k1", "concurrencyKey": "tenant-x",
                                       "runAfter": "2030-01-01T00:00:00Z", "priority": 3,
                                       "maxAttempts": 2, "queue": "other"}],
        ["enqueue", "probe", {"v": 2}, {"idempotencyKey": "k1", "onConflict": "replace",
                                       "runAfter": "2030-01-02T00:00:00Z"}],
        ["enqueue", "probe", {"v": 3}, {"idempotencyKey": "k1"}],
        ["enqueueMany", [{"kind": "probe", "concurrencyKey": "tenant-y"},
                         {"kind": "probe", "payload": {"n": 2}}]],
    )  # fmt: skip
    assert first == replaced == kept
    row = job_by_id(db, first)
    assert (row["payload"], row["concurrency_key"], row["queue"]) == ({"v": 2}, "tenant-x", "other")
    assert (row["priority"], row["max_attempts"]) == (0, 2), "replace takes the new priority"
    assert row["run_after"].isoformat() == "2030-01-02T00:00:00+00:00"
    assert [job_by_id(db, i)["concurrency_key"] for i in many] == ["tenant-y", None]

    # Flow control, the views, the config, and errors that say what is wrong.
    answers = client(
        ["setConcurrencyLimit", "tenant-x", 3],
        ["setConcurrencyLimit", "tenant-x", None],
        ["setConcurrencyLimit", "tenant-x", 0],
        ["setConcurrencyLimit", "", 1],
        ["pause", "other"],
        ["pause", "other"],
        ["setRateLimit", "webhooks", 5, 10],
        ["queueStates"],
        ["stats"],
        ["resume", "other"],
        ["setRateLimit", "webhooks", None],
        ["queueStates"],
        ["schedule", "edge-nightly", "0 3 * * *", "probe", {"report": True}],
        ["schedules"],
        ["schedule", "no spaces", "0 3 * * *", "probe"],
        ["unschedule", "edge-nightly"],
        ["unschedule", "edge-nightly"],
        ["configure"],
        ["maxResultBytes"],
        ["job", 999_999],
    )
    (limit, no_limit, zero, empty_key, paused, paused_again, rated, states, stats, resumed,
     unrated, states_after, cron_job, schedules, bad_name, unscheduled, unscheduled_again,
     config, max_result_bytes, unknown) = answers  # fmt: skip
    assert (limit, no_limit) == (3, None)
    assert zero["error"]["code"] == "22023"
    assert "max_running must be between 1 and 100000, got 0" in zero["error"]["message"]
    assert "set_concurrency_limit()" in zero["error"]["message"]
    assert empty_key["error"]["reason"] == 'a concurrency key is 1 to 200 characters, got ""'
    assert (paused, paused_again, rated, resumed, unrated) == (True, False, None, True, None)
    by_queue = {s["queue"]: s for s in states}
    assert (by_queue["other"]["paused"], by_queue["other"]["queued"]) == (True, 1)
    assert (by_queue["webhooks"]["rate_per_second"], by_queue["webhooks"]["rate_burst"]) == (5, 10)
    assert {s["paused"] for s in stats if s["queue"] == "other"} == {True}
    assert {s["queue"]: s["paused"] for s in states_after} == {"other": False, "default": False}
    assert isinstance(cron_job, int)
    [nightly] = [s for s in schedules if s["name"] == "edge-nightly"]
    assert (nightly["cron"], nightly["kind"], nightly["payload"]) == (
        "0 3 * * *",
        "probe",
        {"report": True},
    )
    assert bad_name["error"]["code"] == "22023"
    assert "a schedule name is 1 to 100 letters" in bad_name["error"]["reason"]
    assert (unscheduled, unscheduled_again) == (True, False)
    assert config["max_result_bytes"] == max_result_bytes == 65536
    assert unknown is None

    # Progress and results, with a claim's lock token.
    (claimed_id, token) = db.execute(
        "select id, lock_token::text from pgqueue.complete_and_claim('test', max_jobs => 1)"
    ).fetchone()
    attempt = {"id": claimed_id, "lock_token": token}
    stale = {"id": claimed_id, "lock_token": "00000000-0000-4000-8000-000000000000"}
    reported, running, stale_report, too_big, completed, done = client(
        ["progress", attempt, {"done": 3}],
        ["job", claimed_id],
        ["progress", stale, {"done": 4}],
        ["complete", attempt, "x" * 70_000],
        ["complete", attempt, {"rows": 1}],
        ["job", claimed_id],
    )
    assert (reported, stale_report, completed) == (True, False, True)
    assert (running["status"], running["progress"]) == ("running", {"done": 3})
    assert too_big["error"]["code"] == "54000"
    assert "the limit is 65536 (max_result_bytes)" in too_big["error"]["reason"]
    assert (done["status"], done["result"]) == ("done", {"rows": 1})

    # Cancelling and retrying a job, and the health checks.
    [parked] = client(["enqueue", "probe", {"v": 9}, {"queue": "parked"}])
    cancelled, cancelled_again, cancelled_row, retried, retried_again, health = client(
        ["cancel", parked],
        ["cancel", parked],
        ["job", parked],
        ["retry", parked, "2030-01-03T00:00:00Z"],
        ["retry", parked],
        ["health"],
    )
    assert (cancelled, cancelled_again, retried, retried_again) == (True, False, True, False)
    assert cancelled_row["status"] == "cancelled"
    row = job_by_id(db, parked)
    assert (row["status"], row["attempts"], row["payload"]) == ("queued", 0, {"v": 9})
    assert row["run_after"].isoformat() == "2030-01-03T00:00:00+00:00"
    assert "pg_net" in {check["component"] for check in health}
    assert all(isinstance(check["ok"], bool) and check["detail"] for check in health)
