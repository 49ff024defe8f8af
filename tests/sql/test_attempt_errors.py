"""Every attempt's error kept with its job, and snoozes (issue 50): fail(), the sweeper's
rescue of an expired lease and the third release in a row record the attempt's error (its
number, when, the worker, the error's type and message), a job keeps its newest 20, each
message bounded, and job(id) lists them wherever the job is, finished too; users see none of
them. snooze() hands a job back due later, its attempt not counted, and a job cannot snooze
past its cap."""

from __future__ import annotations

import uuid
from datetime import timedelta

import psycopg
import pytest

from tests.sql.test_client_jobs import Caller, allow, claim_one
from tests.support.jobs import job

pytestmark = pytest.mark.quick


def enqueue(db: psycopg.Connection, max_attempts: int = 5, key: str | None = None) -> int:
    return db.execute(
        "select pgqueue.enqueue('attempts.probe', max_attempts => %s, idempotency_key => %s)",
        (max_attempts, key),
    ).fetchone()[0]


def claim(db: psycopg.Connection, job_id: int, worker: str = "worker-1") -> str:
    """Claims `job_id` (made due first), as `worker`; its lock token."""
    db.execute("update pgqueue.jobs set run_after = now() where id = %s", (job_id,))
    (claimed, token) = db.execute(
        "select id, lock_token from pgqueue.claim(%s, kinds => array['attempts.probe'])",
        (worker,),
    ).fetchone()
    assert claimed == job_id
    return token


def errors(db: psycopg.Connection, job_id: int) -> list[dict]:
    (found,) = db.execute("select errors from pgqueue.job(%s)", (job_id,)).fetchone()
    return found


def test_each_failed_attempt_is_listed_with_its_number_time_worker_type_and_message(
    db: psycopg.Connection,
) -> None:
    job_id = enqueue(db)
    for attempt, worker in ((1, "worker-a"), (2, "worker-b")):
        token = claim(db, job_id, worker)
        db.execute(
            "select pgqueue.fail(%s, %s, %s, error_type => %s)",
            (job_id, token, f"boom {attempt}\nTraceback ...", "ConnectionError"),
        )
    assert job(db, job_id)["status"] == "queued"
    listed = errors(db, job_id)
    assert [(e["attempt"], e["worker"], e["type"], e["message"]) for e in listed] == [
        (1, "worker-a", "ConnectionError", "boom 1\nTraceback ..."),
        (2, "worker-b", "ConnectionError", "boom 2\nTraceback ..."),
    ]
    assert listed[0]["at"] <= listed[1]["at"]
    # the third attempt succeeds: the done job (kept by batch) still lists both
    db.execute("select pgqueue.complete(%s, %s)", (job_id, claim(db, job_id)))
    done = db.execute("select status, errors from pgqueue.job(%s)", (job_id,)).fetchone()
    assert done[0] == "done" and [e["attempt"] for e in done[1]] == [1, 2]
    assert db.execute("select count(*) from pgqueue.job_history").fetchone() == (0,)


def test_a_job_that_never_fails_lists_no_errors_and_writes_none(db: psycopg.Connection) -> None:
    job_id = enqueue(db, key="kept-in-the-history")
    assert errors(db, job_id) == []
    db.execute("select pgqueue.complete(%s, %s, '{\"ok\": true}')", (job_id, claim(db, job_id)))
    assert job(db, job_id)["status"] == "done"
    assert errors(db, job_id) == []
    assert db.execute("select count(*) from pgqueue.job_errors").fetchone() == (0,)


def test_a_fail_call_of_a_1_3_0_worker_still_works_and_its_type_is_read_from_the_error(
    db: psycopg.Connection,
) -> None:
    """1.3.0's workers call fail(job_id, lock_token, error, retryable, retry_in), by name or by
    position: the new error_type, last and with a default, changes neither."""
    job_id = enqueue(db)
    by_name = db.execute(
        "select pgqueue.fail(job_id => %s, lock_token => %s, error => %s,"
        " retry_in => interval '1 second')",
        (job_id, claim(db, job_id), "KeyError: 'STRIPE_KEY'\nTraceback (most recent call last):"),
    ).fetchone()
    by_position = db.execute(
        "select pgqueue.fail(%s, %s, %s, true, interval '1 second')",
        (job_id, claim(db, job_id), "the upstream answered 503"),
    ).fetchone()
    assert by_name == by_position == ("queued",)
    assert [(e["attempt"], e["type"]) for e in errors(db, job_id)] == [
        (1, "KeyError"),
        (2, None),  # no `Name:` before the message: no type
    ]
    assert job(db, job_id)["due_in"] <= timedelta(seconds=1)


def test_a_job_keeps_its_newest_20_errors_each_at_most_8192_characters(
    db: psycopg.Connection,
) -> None:
    job_id = enqueue(db, max_attempts=25)
    for attempt in range(1, 26):
        db.execute(
            "select pgqueue.fail(%s, %s, %s, error_type => %s)",
            (job_id, claim(db, job_id), f"{attempt}:" + "x" * 50_000, "T" * 500),
        )
    listed = errors(db, job_id)
    assert [e["attempt"] for e in listed] == list(range(6, 26))
    assert {len(e["message"]) for e in listed} == {8192}
    assert {e["type"] for e in listed} == {"T" * 200}
    assert job(db, job_id)["status"] == "failed", "the dead letter keeps its errors"
    assert len(job(db, job_id)["last_error"]) == 10_000


def test_a_rescued_lease_and_a_third_release_in_a_row_are_recorded_as_errors(
    db: psycopg.Connection,
) -> None:
    job_id = enqueue(db)
    claim(db, job_id, "worker-lost")
    db.execute("update pgqueue.claims set locked_until = now() - interval '1 second'")
    db.execute("select pgqueue.sweep()")
    for _ in range(3):
        token = claim(db, job_id, "worker-stopping")
        assert db.execute("select pgqueue.release(%s, %s)", (job_id, token)).fetchone() == (True,)
    (lost, released) = errors(db, job_id)
    assert (lost["attempt"], lost["worker"], lost["type"]) == (1, "worker-lost", "LeaseExpired")
    assert lost["message"].startswith("lease expired at ")
    assert (released["attempt"], released["worker"]) == (2, "worker-stopping")
    assert released["type"] == "Released"
    assert released["message"] == job(db, job_id)["last_error"]


def test_users_see_only_the_user_facing_error_never_the_attempts_errors(
    clients: psycopg.Connection, app_api
) -> None:
    alice = Caller(app_api, "authenticated", uuid.uuid4())
    allow(clients, max_per_user=5)
    job_id = alice.submit({"n": 1}).json()
    clients.execute("update pgqueue.jobs set max_attempts = 3 where id = %s", (job_id,))
    _, token = claim_one(clients)
    clients.execute(
        "select pgqueue.fail(%s, %s, %s, error_type => 'KeyError')",
        (job_id, token, "KeyError: 'STRIPE_KEY' (sk_live_secret)"),
    )
    clients.execute("update pgqueue.jobs set run_after = now() where id = %s", (job_id,))
    _, token = claim_one(clients)
    clients.execute(
        "select pgqueue.fail_user_facing(%s, %s, 'the export is over 1 GB')", (job_id, token)
    )
    [mine] = alice.my_jobs()
    assert (mine["status"], mine["error"]) == ("failed", "the export is over 1 GB")
    assert "sk_live_secret" not in str(mine) and "errors" not in mine
    # the operator's job(id) has both attempts
    listed = errors(clients, job_id)
    assert [(e["attempt"], e["type"]) for e in listed] == [(1, "KeyError"), (2, "UserFacingError")]


def test_snooze_hands_the_job_back_due_later_without_spending_an_attempt(
    db: psycopg.Connection,
) -> None:
    job_id = enqueue(db, max_attempts=2)
    for snoozes in (1, 2, 3):
        token = claim(db, job_id)
        assert db.execute("select pgqueue.snooze(%s, %s, 30)", (job_id, token)).fetchone() == (
            "queued",
        )
        row = db.execute(
            "select status, attempts, snoozes, errors, run_after - now() from pgqueue.job(%s)",
            (job_id,),
        ).fetchone()
        assert row[:4] == ("queued", 0, snoozes, [])
        assert timedelta(seconds=29) < row[4] <= timedelta(seconds=30)
    # its attempt still runs once snoozing ends; the count is kept when it is done
    db.execute("select pgqueue.complete(%s, %s)", (job_id, claim(db, job_id)))
    assert db.execute(
        "select status, attempts, snoozes from pgqueue.job(%s)", (job_id,)
    ).fetchone() == ("done", 1, 3)


def test_a_snooze_past_the_cap_fails_the_job_for_good_saying_why(db: psycopg.Connection) -> None:
    job_id = enqueue(db)
    for _ in range(2):
        token = claim(db, job_id)
        db.execute("select pgqueue.snooze(%s, %s, 0, max_snoozes => 2)", (job_id, token))
    token = claim(db, job_id, "worker-capped")
    assert db.execute(
        "select pgqueue.snooze(%s, %s, 0, max_snoozes => 2)", (job_id, token)
    ).fetchone() == ("failed",)
    dead = db.execute(
        "select status, snoozes, last_error, errors from pgqueue.job(%s)", (job_id,)
    ).fetchone()
    assert dead[:2] == ("failed", 2)
    assert dead[2].startswith("snoozed 2 times, its cap (max_snoozes)")
    assert f"retry({job_id})" in dead[2]
    assert [(e["type"], e["worker"]) for e in dead[3]] == [("SnoozeLimit", "worker-capped")]
    # retry() starts the count again
    assert db.execute("select pgqueue.retry(%s)", (job_id,)).fetchone() == (True,)
    assert job(db, job_id)["status"] == "queued"
    (snoozes,) = db.execute("select snoozes from pgqueue.job(%s)", (job_id,)).fetchone()
    assert snoozes == 0
    token = claim(db, job_id)
    assert db.execute(
        "select pgqueue.snooze(%s, %s, 0, max_snoozes => 2)", (job_id, token)
    ).fetchone() == ("queued",)


@pytest.mark.parametrize(
    ("seconds", "max_snoozes"),
    [
        ("-1", 100),
        ("NaN", 100),
        ("Infinity", 100),
        ("2e9", 100),
        (None, 100),
        ("10", 0),
        ("10", None),
        ("10", 10_001),
    ],
)
def test_snooze_refuses_a_bad_delay_or_cap_and_the_job_runs_on(
    db: psycopg.Connection, seconds: str | None, max_snoozes: int | None
) -> None:
    job_id = enqueue(db)
    token = claim(db, job_id)
    with pytest.raises(
        psycopg.errors.InvalidParameterValue, match=r"snooze: (seconds|max_snoozes)"
    ):
        db.execute(
            "select pgqueue.snooze(%s, %s, %s::double precision, %s)",
            (job_id, token, seconds, max_snoozes),
        )
    assert job(db, job_id)["status"] == "running"
    assert db.execute("select pgqueue.snooze(%s, %s, 1)", (job_id, token)).fetchone() == ("queued",)
    # a stale token snoozes nothing
    assert db.execute("select pgqueue.snooze(%s, %s, 1)", (job_id, token)).fetchone() == (None,)


def test_sweep_prunes_the_errors_and_snoozes_of_finished_jobs_past_retention(
    db: psycopg.Connection,
) -> None:
    done = enqueue(db)
    db.execute("select pgqueue.fail(%s, %s, 'E: x')", (done, claim(db, done)))
    db.execute("select pgqueue.snooze(%s, %s, 0)", (done, claim(db, done)))
    db.execute("select pgqueue.complete(%s, %s)", (done, claim(db, done)))
    dead = enqueue(db, max_attempts=1)
    db.execute("select pgqueue.fail(%s, %s, 'E: x')", (dead, claim(db, dead)))
    live = enqueue(db)
    db.execute("select pgqueue.fail(%s, %s, 'E: x')", (live, claim(db, live)))
    db.execute("update pgqueue.job_errors set at = at - interval '400 days'")
    db.execute("update pgqueue.job_snoozes set snoozed_at = snoozed_at - interval '400 days'")
    # the dead letter is still kept (finished now): its errors too; the live job keeps its own
    db.execute("select pgqueue.sweep()")
    left = db.execute("select job_id from pgqueue.job_errors order by job_id").fetchall()
    assert left == [(dead,), (live,)]
    assert db.execute("select count(*) from pgqueue.job_snoozes").fetchone() == (0,)
    db.execute("update pgqueue.job_history set finished_at = now() - interval '400 days'")
    db.execute("select pgqueue.sweep()")
    assert db.execute("select job_id from pgqueue.job_errors").fetchall() == [(live,)]
