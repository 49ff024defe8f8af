"""The queue's SQL API on a real PostgreSQL: claims, leases, failures, the sweeper, access."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from testkit.cluster import Cluster
from testkit.stack import wait_for_pg_net
from tests.support.http_sink import HttpSink
from tests.support.jobs import job
from tests.support.schema import PINS_ITS_PATH
from tests.support.wake_signing import verified

# The queue's SQL contract: all of it is part of the quick loop (scripts/test --quick).
pytestmark = pytest.mark.quick

# A field that sends enqueue_many() down its row path: jobs that set anything but kind, payload
# and queue are stored a row a job in pgqueue.jobs, not as one pgqueue.job_batches row. For the
# tests of what happens to those rows.
AS_ROWS = {"priority": 0}


def enqueue_n(db: psycopg.Connection, n: int, kind: str = "test.noop", **fields) -> list[int]:
    jobs = Jsonb([{"kind": kind, "payload": {"n": i}, **fields} for i in range(n)])
    return [r[0] for r in db.execute("select pgqueue.enqueue_many(%s)", (jobs,))]


def claim(db: psycopg.Connection, max_jobs: int = 1, **kw) -> list[dict]:
    args = ", ".join(f"{k} => %({k})s" for k in kw)
    sql = f"select * from pgqueue.claim('test-worker', %(max_jobs)s{', ' + args if args else ''})"
    with db.cursor(row_factory=psycopg.rows.dict_row) as cur:
        return cur.execute(sql, {"max_jobs": max_jobs, **kw}).fetchall()


def finish(db: psycopg.Connection, ids: list[int], status: str, ago: str) -> None:
    """Move jobs to the history as finished `ago` (as their workers or the sweeper would have,
    only sooner)."""
    db.execute(
        "with r as (delete from pgqueue.jobs where id = any(%(ids)s) returning *)"
        " insert into pgqueue.job_history (id, queue, kind, status, priority, attempts,"
        " max_attempts, payload, idempotency_key, created_at, finished_at)"
        " select id, queue, kind, %(status)s, priority, attempts, max_attempts,"
        " case when %(status)s <> 'done' then payload end, idempotency_key, created_at,"
        " now() - %(ago)s::interval from r",
        {"ids": ids, "status": status, "ago": ago},
    )


def expire_lease(db: psycopg.Connection, job_id: int) -> None:
    db.execute(
        "update pgqueue.claims set locked_until = now() - interval '1 second' where %s = any (ids)",
        (job_id,),
    )


def test_eight_concurrent_claimers_drain_ten_thousand_jobs_exactly_once(
    db: psycopg.Connection, stack: Cluster
) -> None:
    enqueue_n(db, 10_000)
    max_jobs = 25
    completions: Counter[int] = Counter()
    largest_claim = 0
    errors: list[BaseException] = []
    lock = threading.Lock()

    def claimer(n: int) -> None:
        nonlocal largest_claim
        try:
            with stack.connect(autocommit=True) as conn:
                while True:
                    rows = conn.execute(
                        "select id, lock_token from pgqueue.claim(%s, %s)", (f"w{n}", max_jobs)
                    ).fetchall()
                    if not rows:
                        return
                    ids, tokens = zip(*rows, strict=True)
                    done = conn.execute(
                        "select pgqueue.complete_many(%s, %s)", (list(ids), list(tokens))
                    ).fetchall()
                    with lock:
                        largest_claim = max(largest_claim, len(rows))
                        completions.update(r[0] for r in done)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)

    assert not errors
    assert largest_claim <= max_jobs
    assert len(completions) == 10_000
    assert set(completions.values()) == {1}, "a job was completed twice"
    assert db.execute(
        "select status, attempts, count(*) from pgqueue.all_jobs group by 1, 2"
    ).fetchall() == [("done", 1, 10_000)]


def test_claim_never_returns_more_than_max_jobs(db: psycopg.Connection) -> None:
    enqueue_n(db, 50)
    assert [len(claim(db, n)) for n in (1, 7, 30, 30)] == [1, 7, 30, 12]


def test_claim_order_priority_then_due_time(db: psycopg.Connection) -> None:
    recent = db.execute("select pgqueue.enqueue('k')").fetchone()[0]
    older = db.execute(
        "select pgqueue.enqueue('k', run_after => now() - interval '1 hour')"
    ).fetchone()[0]
    urgent = db.execute("select pgqueue.enqueue('k', priority => 5)").fetchone()[0]
    delayed = db.execute(
        "select pgqueue.enqueue('k', run_after => now() + interval '1 hour')"
    ).fetchone()[0]
    assert [j["id"] for j in claim(db, 1)] == [urgent]
    assert [j["id"] for j in claim(db, 1)] == [older]
    assert [j["id"] for j in claim(db, 1)] == [recent]
    assert claim(db, 10) == [], "a delayed job is not runnable before its run_after"
    assert job(db, delayed)["status"] == "queued"


def test_claim_filters_by_kind_and_queue(db: psycopg.Connection) -> None:
    email = db.execute("select pgqueue.enqueue('email.send')").fetchone()[0]
    hook = db.execute("select pgqueue.enqueue('webhook.post')").fetchone()[0]
    other = db.execute("select pgqueue.enqueue('email.send', queue => 'bulk')").fetchone()[0]
    assert [j["id"] for j in claim(db, 10, kinds=["email.send"])] == [email]
    assert [j["id"] for j in claim(db, 10, queue="bulk")] == [other]
    assert [j["id"] for j in claim(db, 10)] == [hook]


def test_claim_counts_the_attempt_and_grants_a_lease(db: psycopg.Connection) -> None:
    db.execute("select pgqueue.enqueue('k')")
    (claimed,) = claim(db, 1, lease_seconds=42)
    assert claimed["attempts"] == 1
    assert claimed["locked_by"] == "test-worker"
    assert claimed["locked_until"] - claimed["locked_at"] == timedelta(seconds=42)
    assert claimed["lock_token"] is not None


@pytest.mark.parametrize("bad", [0, -1, 10_001])
def test_claim_rejects_a_bad_batch_size(db: psycopg.Connection, bad: int) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="max_jobs must be between"):
        claim(db, bad)


def test_enqueue_is_idempotent_on_its_key(db: psycopg.Connection) -> None:
    first = db.execute("select pgqueue.enqueue('k', '{\"v\": 1}', idempotency_key => 'order-1')")
    again = db.execute("select pgqueue.enqueue('k', '{\"v\": 2}', idempotency_key => 'order-1')")
    assert first.fetchone() == again.fetchone()
    assert db.execute("select count(*), min(payload->>'v') from pgqueue.all_jobs").fetchone() == (
        1,
        "1",
    )


def test_enqueue_many_returns_ids_in_input_order_and_honours_keys(db: psycopg.Connection) -> None:
    existing = db.execute("select pgqueue.enqueue('k', idempotency_key => 'a')").fetchone()[0]
    ids = enqueue_n(db, 0)  # an empty array enqueues nothing
    assert ids == []
    jobs = Jsonb(
        [
            {"kind": "k", "payload": {"i": 0}},
            {"kind": "k", "idempotency_key": "a"},
            {"kind": "k", "idempotency_key": "b", "priority": 3},
            {"kind": "k", "idempotency_key": "b"},
            {"kind": "other", "queue": "q2", "max_attempts": 9},
        ]
    )
    ids = [r[0] for r in db.execute("select pgqueue.enqueue_many(%s)", (jobs,))]
    assert ids[1] == existing
    assert ids[2] == ids[3] != existing
    assert len(set(ids)) == 4
    assert job(db, ids[0])["payload"] == {"i": 0}
    assert job(db, ids[2])["priority"] == 3
    last = job(db, ids[4])
    assert (last["kind"], last["queue"], last["max_attempts"]) == ("other", "q2", 9)
    assert db.execute("select count(*) from pgqueue.all_jobs").fetchone() == (4,)


def test_enqueue_many_without_keys_returns_ids_in_input_order(db: psycopg.Connection) -> None:
    # no element has a key (a null key is none): the path that skips the key lookups
    jobs = [{"kind": f"k{i}", "payload": {"i": i}} for i in range(300)]
    jobs[7] |= {"idempotency_key": None, "queue": "q2", "priority": 2, "max_attempts": 9}
    ids = [r[0] for r in db.execute("select pgqueue.enqueue_many(%s)", (Jsonb(jobs),))]
    assert len(ids) == len(set(ids)) == 300
    rows = {
        r[0]: r[1:]
        for r in db.execute(
            "select id, kind, payload, queue, priority, max_attempts, idempotency_key,"
            " run_after <= now() from pgqueue.all_jobs"
        )
    }
    assert [rows[i][0] for i in ids] == [f"k{i}" for i in range(300)]
    assert [rows[i][1] for i in ids] == [{"i": i} for i in range(300)]
    assert rows[ids[7]][2:] == ("q2", 2, 9, None, True)
    assert rows[ids[8]][2:] == ("default", 0, 5, None, True)


def test_enqueue_many_rejects_a_non_array(db: psycopg.Connection) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="JSON array"):
        db.execute('select pgqueue.enqueue_many(\'{"kind": "k"}\')')


def test_enqueue_rejects_an_empty_kind(db: psycopg.Connection) -> None:
    with pytest.raises(psycopg.errors.CheckViolation, match="jobs_kind_check"):
        db.execute("select pgqueue.enqueue('')")


@pytest.mark.parametrize(
    "columns",
    [
        "status => 'running', lock_token => gen_random_uuid(), locked_until => now()",
        "status => 'done', finished_at => now()",
        "lock_token => gen_random_uuid()",
        "locked_until => now()",
        "finished_at => now()",
    ],
)
def test_a_plain_insert_of_a_job_that_is_not_queued_is_refused(
    db: psycopg.Connection, columns: str
) -> None:
    """The job table holds queued jobs only: running ones are claims, finished ones history."""
    pairs = [c.split(" => ") for c in columns.split(", ")]
    names = ", ".join(name for name, _ in pairs)
    values = ", ".join(value for _, value in pairs)
    with pytest.raises(psycopg.errors.CheckViolation, match="jobs_queued_check"):
        db.execute(f"insert into pgqueue.jobs (kind, {names}) values ('k', {values})")
    assert db.execute("select count(*) from pgqueue.live_jobs").fetchone()[0] == 0


def test_backoff_grows_until_the_last_failure_dead_letters_and_replay_revives(
    db: psycopg.Connection,
) -> None:
    job_id = db.execute("select pgqueue.enqueue('k', max_attempts => 4)").fetchone()[0]
    delays = []
    for attempt in range(1, 5):
        db.execute("update pgqueue.jobs set run_after = now() where id = %s", (job_id,))
        (claimed,) = claim(db)
        assert claimed["attempts"] == attempt
        status = db.execute(
            "select pgqueue.fail(%s, %s, %s)", (job_id, claimed["lock_token"], f"boom {attempt}")
        ).fetchone()[0]
        row = job(db, job_id)
        if attempt < 4:
            assert status == "queued"
            delays.append((row["run_after"] - row["created_at"]).total_seconds())
        else:
            assert status == "failed"
    # 5 s, 10 s, 20 s steps with jitter in the upper half of each step: strictly growing
    assert delays == sorted(delays) and len(set(delays)) == 3
    assert 2.5 <= delays[0] <= 5.5 and 5 <= delays[1] <= 10.5 and 10 <= delays[2] <= 20.5
    dead = job(db, job_id)
    assert dead["status"] == "failed" and dead["last_error"] == "boom 4"
    assert dead["finished_at"] is not None and dead["lock_token"] is None
    assert db.execute("select id, last_error from pgqueue.dead_letters").fetchall() == [
        (job_id, "boom 4")
    ]

    assert db.execute("select pgqueue.retry(%s)", (job_id,)).fetchone() == (True,)
    revived = job(db, job_id)
    assert (revived["status"], revived["attempts"], revived["finished_at"]) == ("queued", 0, None)
    assert [j["id"] for j in claim(db)] == [job_id]
    assert db.execute("select pgqueue.retry(%s)", (job_id,)).fetchone() == (False,)


def test_fail_can_dead_letter_at_once_or_retry_after_a_given_delay(db: psycopg.Connection) -> None:
    a, b = enqueue_n(db, 2)
    by_id = {j["id"]: j["lock_token"] for j in claim(db, 2)}
    assert db.execute(
        "select pgqueue.fail(%s, %s, 'invalid payload', retryable => false)", (a, by_id[a])
    ).fetchone() == ("failed",)
    assert db.execute(
        "select pgqueue.fail(%s, %s, 'rate limited', retry_in => interval '90 seconds')",
        (b, by_id[b]),
    ).fetchone() == ("queued",)
    delay = db.execute(
        "select run_after - now() from pgqueue.all_jobs where id = %s", (b,)
    ).fetchone()[0]
    assert timedelta(seconds=89) < delay <= timedelta(seconds=90)


def test_fail_keeps_a_bounded_error(db: psycopg.Connection) -> None:
    (job_id,) = enqueue_n(db, 1)
    (claimed,) = claim(db)
    db.execute("select pgqueue.fail(%s, %s, %s)", (job_id, claimed["lock_token"], "x" * 50_000))
    assert len(job(db, job_id)["last_error"]) == 10_000


def test_stale_token_is_refused_after_the_sweeper_rescues_the_job(db: psycopg.Connection) -> None:
    (job_id,) = enqueue_n(db, 1)
    (old,) = claim(db)
    expire_lease(db, job_id)
    rescued, dead, _pruned, _woke = db.execute("select * from pgqueue.sweep()").fetchone()
    assert (rescued, dead) == (1, 0)
    rescued_job = job(db, job_id)
    assert rescued_job["status"] == "queued"
    assert "lease expired" in rescued_job["last_error"]

    (new,) = claim(db)
    assert new["lock_token"] != old["lock_token"] and new["attempts"] == 2
    token = old["lock_token"]
    assert db.execute("select pgqueue.complete(%s, %s)", (job_id, token)).fetchone() == (False,)
    assert db.execute("select pgqueue.fail(%s, %s, 'late')", (job_id, token)).fetchone() == (None,)
    assert db.execute("select pgqueue.heartbeat(%s, %s)", (job_id, token)).fetchone() == (False,)
    assert db.execute("select pgqueue.release(%s, %s)", (job_id, token)).fetchone() == (False,)
    assert db.execute("select pgqueue.complete_many(%s, %s)", ([job_id], [token])).fetchall() == []
    still = job(db, job_id)
    assert (still["status"], still["lock_token"]) == ("running", new["lock_token"])
    assert db.execute(
        "select pgqueue.complete(%s, %s)", (job_id, new["lock_token"])
    ).fetchone() == (True,)


@pytest.mark.parametrize("stored", [AS_ROWS, {}], ids=["rows", "batch"])
def test_a_rescued_job_keeps_its_place_in_the_queue(
    db: psycopg.Connection, stack: Cluster, stored: dict
) -> None:
    """A job whose worker died goes back where it was in claim order (its run_after and id,
    its attempt counted), not behind the backlog (issue 48: a rescued job ran 71 s after its
    worker died): the next claim, another worker's, takes it first within its priority."""
    first, *backlog = enqueue_n(db, 20, **stored)
    due = job(db, first)["run_after"]
    (claimed,) = claim(db)
    assert claimed["id"] == first
    later = enqueue_n(db, 5, **AS_ROWS)
    (urgent,) = db.execute("select pgqueue.enqueue('test.noop', priority => 1)").fetchone()
    expire_lease(db, first)
    assert db.execute("select rescued from pgqueue.sweep()").fetchone() == (1,)

    with stack.connect(autocommit=True) as other:
        assert [j["id"] for j in claim(other, 3)] == [urgent, first, backlog[0]]
    again = job(db, first)
    assert (again["status"], again["attempts"], again["run_after"]) == ("running", 2, due)
    queued = len(backlog) - 1 + len(later)
    assert db.execute(
        "select (select count(*) from pgqueue.live_jobs where status = 'queued'),"
        " (select sum(jobs) from pgqueue.queued_counts)"
    ).fetchone() == (queued, queued)


def test_sweeper_dead_letters_an_expired_job_with_no_attempts_left(
    db: psycopg.Connection,
) -> None:
    db.execute("select pgqueue.enqueue('k', max_attempts => 1)")
    (claimed,) = claim(db)
    expire_lease(db, claimed["id"])
    assert db.execute("select rescued, dead_lettered from pgqueue.sweep()").fetchone() == (0, 1)
    dead = job(db, claimed["id"])
    assert dead["status"] == "failed" and "lease expired" in dead["last_error"]


def test_sweeper_leaves_valid_and_heartbeated_leases_alone(db: psycopg.Connection) -> None:
    enqueue_n(db, 4)
    (a,) = claim(db, 1, lease_seconds=1)
    b, mate = claim(db, 2, lease_seconds=1)
    db.execute("update pgqueue.claims set locked_until = now() - interval '1 second'")
    # b's worker heartbeats before the sweeper runs: the lease is extended and b keeps it,
    # with the job claimed in the same call (a lease is the claim's)
    assert db.execute(
        "select pgqueue.heartbeat(%s, %s, 300)", (b["id"], b["lock_token"])
    ).fetchone() == (True,)
    assert db.execute("select rescued from pgqueue.sweep()").fetchone() == (1,)
    assert job(db, a["id"])["status"] == "queued"
    assert job(db, b["id"])["status"] == job(db, mate["id"])["status"] == "running"


def test_sweeper_prunes_finished_jobs_past_retention_but_keeps_dead_letters_longer(
    db: psycopg.Connection,
) -> None:
    ids = enqueue_n(db, 4)
    claimed = {j["id"]: j["lock_token"] for j in claim(db, 4)}
    for i in ids[:3]:
        db.execute("select pgqueue.complete(%s, %s)", (i, claimed[i]))
    db.execute("select pgqueue.fail(%s, %s, 'x', retryable => false)", (ids[3], claimed[ids[3]]))
    # each complete() wrote a batch of one; the first two and the dead letter finished long ago
    old = [ids[0], ids[1], ids[3]]
    db.execute(
        "update pgqueue.done_batches set finished_at = now() - interval '8 days'"
        " where ids <@ %s::bigint[]",
        (old,),
    )
    db.execute(
        "update pgqueue.job_history set finished_at = now() - interval '8 days' where id = any(%s)",
        (old,),
    )
    assert db.execute("select pruned from pgqueue.sweep()").fetchone() == (2,)
    remaining = [r[0] for r in db.execute("select id from pgqueue.all_jobs order by id")]
    assert remaining == [ids[2], ids[3]]


def test_cancel_stops_a_queued_job_and_makes_a_running_token_stale(
    db: psycopg.Connection,
) -> None:
    queued, running = enqueue_n(db, 2, **AS_ROWS)
    db.execute("update pgqueue.jobs set priority = 1 where id = %s", (running,))
    (claimed,) = claim(db)
    assert claimed["id"] == running
    assert db.execute("select pgqueue.cancel(%s)", (queued,)).fetchone() == (True,)
    assert db.execute("select pgqueue.cancel(%s)", (running,)).fetchone() == (True,)
    assert db.execute(
        "select pgqueue.complete(%s, %s)", (running, claimed["lock_token"])
    ).fetchone() == (False,)
    assert claim(db) == []
    assert db.execute("select pgqueue.cancel(%s)", (queued,)).fetchone() == (False,)
    assert db.execute("select pgqueue.retry(%s)", (queued,)).fetchone() == (True,)


def test_release_returns_a_job_without_counting_the_attempt(db: psycopg.Connection) -> None:
    (job_id,) = enqueue_n(db, 1)
    (claimed,) = claim(db)
    assert db.execute(
        "select pgqueue.release(%s, %s)", (job_id, claimed["lock_token"])
    ).fetchone() == (True,)
    assert (job(db, job_id)["status"], job(db, job_id)["attempts"]) == ("queued", 0)
    assert claim(db)[0]["attempts"] == 1


def claim_and_release(db: psycopg.Connection, job_id: int) -> None:
    db.execute("update pgqueue.jobs set run_after = now() where id = %s", (job_id,))
    (claimed,) = claim(db)
    assert db.execute(
        "select pgqueue.release(%s, %s)", (job_id, claimed["lock_token"])
    ).fetchone() == (True,)


def test_the_third_release_in_a_row_counts_the_attempt_until_the_job_dead_letters(
    db: psycopg.Connection,
) -> None:
    """A job its worker always stops before it ends (longer than an Edge Function's isolate
    lives) is not released forever: every third release counts its attempt, with backoff,
    and the last attempt dead-letters it with an error that says why."""
    (job_id,) = enqueue_n(db, 1, max_attempts=2)
    for _ in range(2):
        claim_and_release(db, job_id)
        row = job(db, job_id)
        assert (row["status"], row["attempts"], row["last_error"]) == ("queued", 0, None)
        assert row["due_in"] <= timedelta(0)
    claim_and_release(db, job_id)
    row = job(db, job_id)
    assert (row["status"], row["attempts"]) == ("queued", 1)
    assert row["last_error"] == (
        "released 3 times in a row without finishing (its worker stopped each time before the"
        " job ended): counted as attempt 1 of 2"
    )
    assert row["due_in"] > timedelta(seconds=2), "retried after a backoff, as a failure is"
    for _ in range(2):
        claim_and_release(db, job_id)
        assert (job(db, job_id)["status"], job(db, job_id)["attempts"]) == ("queued", 1)
    claim_and_release(db, job_id)
    dead = job(db, job_id)
    assert (dead["status"], dead["attempts"]) == ("failed", 2)
    assert dead["last_error"].endswith("counted as attempt 2 of 2")
    # a dead letter brought back starts with no releases counted
    assert db.execute("select pgqueue.retry(%s)", (job_id,)).fetchone() == (True,)
    releases = db.execute("select releases from pgqueue.jobs where id = %s", (job_id,))
    assert releases.fetchone() == (0,)
    claim_and_release(db, job_id)
    assert (job(db, job_id)["status"], job(db, job_id)["attempts"]) == ("queued", 0)


def test_an_attempt_counted_between_releases_starts_their_count_again(
    db: psycopg.Connection,
) -> None:
    (job_id,) = enqueue_n(db, 1, max_attempts=5)
    claim_and_release(db, job_id)
    claim_and_release(db, job_id)
    (claimed,) = claim(db)
    assert db.execute(
        "select pgqueue.fail(%s, %s, 'boom')", (job_id, claimed["lock_token"])
    ).fetchone() == ("queued",)
    # a lease the sweeper rescues counts an attempt too
    db.execute("update pgqueue.jobs set run_after = now() where id = %s", (job_id,))
    claim(db)
    expire_lease(db, job_id)
    assert db.execute("select rescued from pgqueue.sweep()").fetchone() == (1,)
    for _ in range(2):
        claim_and_release(db, job_id)
        assert job(db, job_id)["attempts"] == 2
    claim_and_release(db, job_id)
    assert job(db, job_id)["attempts"] == 3


def test_a_job_carries_its_releases_in_a_row_while_queued_and_running(
    db: psycopg.Connection,
) -> None:
    """The count goes with the job (jobs.releases, and the job as its claim holds it while it runs):
    nothing is left behind when the job finishes, and a counted attempt requeues it with 0."""
    (job_id,) = enqueue_n(db, 1, **AS_ROWS)
    releases = "select releases from pgqueue.jobs where id = %s"
    claim_and_release(db, job_id)
    claim_and_release(db, job_id)
    assert db.execute(releases, (job_id,)).fetchone() == (2,)
    (claimed,) = claim(db)
    claimed_releases = (
        "select e.releases from pgqueue.claims as c, unnest(c.jobs) as e where e.id = %s"
    )
    assert db.execute(claimed_releases, (job_id,)).fetchone() == (2,)
    assert claimed["releases"] == 2, "claim() returns it with the job's row"
    db.execute("select pgqueue.fail(%s, %s, 'boom')", (job_id, claimed["lock_token"]))
    assert db.execute(releases, (job_id,)).fetchone() == (0,)


def test_stats_count_jobs_and_the_age_of_the_oldest_runnable(db: psycopg.Connection) -> None:
    db.execute("select pgqueue.enqueue('a', run_after => now() - interval '10 minutes')")
    db.execute("select pgqueue.enqueue('a')")
    db.execute("select pgqueue.enqueue('b', run_after => now() + interval '1 hour')")
    with db.cursor(row_factory=psycopg.rows.dict_row) as cur:
        rows = {r["kind"]: r for r in cur.execute("select * from pgqueue.stats")}
    assert (rows["a"]["jobs"], rows["a"]["runnable"]) == (2, 2)
    # (to the second: a job is counted under the end of the second it fell due in)
    assert rows["a"]["oldest_runnable_age"] > timedelta(minutes=10) - timedelta(seconds=1)
    assert (rows["b"]["jobs"], rows["b"]["runnable"], rows["b"]["oldest_runnable_age"]) == (
        1,
        0,
        None,
    )


ROLES = ["anon", "authenticated"]


def queue_functions(db: psycopg.Connection) -> list[tuple[str, int]]:
    return db.execute(
        "select p.oid::regprocedure::text, p.pronargs from pg_proc as p"
        " where p.pronamespace = 'pgqueue'::regnamespace order by 1"
    ).fetchall()


@pytest.mark.parametrize("role", ROLES)
def test_api_roles_can_neither_read_the_table_nor_execute_any_function(
    db: psycopg.Connection, role: str
) -> None:
    db.execute("select pgqueue.enqueue('secret.kind')")
    functions = queue_functions(db)
    assert len(functions) >= 12
    for relation in ("pgqueue.jobs", "pgqueue.stats", "pgqueue.dead_letters"):
        with db.transaction(force_rollback=True):
            db.execute(f"set local role {role}")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                db.execute(f"select * from {relation}")
    for signature, nargs in functions:
        name = signature.split("(")[0]
        call = f"select {name}({', '.join(['null'] * nargs)})"
        if name.endswith("jobs_wake_workers"):
            call = f"select {name}()"  # a trigger function: refused before it runs
        with db.transaction(force_rollback=True):
            db.execute(f"set local role {role}")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                db.execute(call)


def test_service_role_has_exactly_the_worker_api(db: psycopg.Connection) -> None:
    allowed = {
        sig
        for sig, _ in queue_functions(db)
        if db.execute(
            "select has_function_privilege('service_role', %s, 'execute')", (sig,)
        ).fetchone()[0]
    }
    assert {s.split("(")[0].removeprefix("pgqueue.") for s in allowed} == {
        "enqueue",
        "enqueue_many",
        "claim",
        "complete",
        "complete_many",
        "fail",
        "heartbeat",
        "heartbeat_many",
        "release",
        "retry",
        "cancel",
        "complete_and_claim",
        "set_concurrency_limit",
        "pause",
        "resume",
        "set_rate_limit",
        "progress",
        "job",
        "schedule",
        "unschedule",
        "sweep",
        "configure",
        "default_max_attempts",
        "health",
        "checkin",
        "metrics",
        "throughput",
        "trace_contexts",
        # release 1.1.0: what signed-in users may submit, and who submitted a job
        "allow_client_kind",
        "disallow_client_kind",
        "job_owners",
        "checkout",
        # release 1.2.0: a failure whose message the job's owner reads
        "fail_user_facing",
        # release 1.3.0: what the view stats calls, which its reader must be allowed to
        "_live_counts",
        # release 1.3.0: what a reader of queued_counts and a plain INSERT into jobs (the
        # traceparent domain's check) execute
        "_due_bucket",
        "_is_traceparent",
        # release 1.4.0: what a reader of schedules calls for the next runs
        "_cron_runs",
        # release 1.4.0: the dashboard's job list, and its bulk actions
        "list_jobs",
        "count_jobs",
        "retry_jobs",
        "cancel_jobs",
        # release 1.4.0: a job run again later, its attempt not counted
        "snooze",
        # release 1.5.0: workflows, drawn, and a job's dependencies' results
        "workflow",
        "dependency_results",
    }
    with db.transaction(force_rollback=True):
        db.execute("set local role service_role")
        job_id = db.execute("select pgqueue.enqueue('from.service')").fetchone()[0]
        assert db.execute("select count(*) from pgqueue.stats").fetchone()[0] == 1
        (claimed,) = claim(db)
        assert claimed["id"] == job_id
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            db.execute("update pgqueue.jobs set status = 'done'")


def unpinned(db: psycopg.Connection) -> list[str]:
    """The queue's functions that neither pin search_path first nor are the inlined exception,
    or that set anything but the hot path's planner settings after it."""
    rows = db.execute(
        f"select p.proname, p.proconfig, {PINS_ITS_PATH} from pg_proc as p"
        " where p.pronamespace in ('pgqueue'::regnamespace, 'pgqueue_public'::regnamespace)"
    ).fetchall()
    assert len(rows) >= 60
    # search_path first; the hot path also fixes its plan cache mode (see complete_and_claim()),
    # and completions keep to claims_pkey (see complete_claimed())
    return sorted(
        name
        for name, config, pinned in rows
        if not pinned
        or any(
            not setting.startswith("plan_cache_mode=") and setting != "enable_seqscan=off"
            for setting in (config or [])[1:]
        )
    )


def test_every_queue_function_pins_its_search_path_with_pg_temp_last(
    db: psycopg.Connection,
) -> None:
    """Every function of the queue's schemas, SECURITY DEFINER or not, sets search_path =
    pg_catalog, pg_temp: with pg_temp left out (an empty path), PostgreSQL looks up tables and
    types in the caller's temporary schema first (tests/sql/test_temp_shadowing.py shows the
    attack it stops). The one exception is an inlined helper (PINS_ITS_PATH)."""
    assert unpinned(db) == []
    assert db.execute(
        "select proconfig is null from pg_proc where oid = 'pgqueue._due_bucket'::regproc"
    ).fetchone() == (True,), "the due bucket is inlined into its callers"


@pytest.mark.parametrize(
    ("name", "shape"),
    [
        ("_planted", "language sql security definer"),
        ("planted", "language sql"),
        ("_planted", "language plpgsql"),
        ("_planted", "language sql set work_mem = '1MB'"),
    ],
    ids=["security-definer", "not-underscored", "plpgsql", "other-setting"],
)
def test_only_an_internal_sql_function_without_settings_may_leave_the_path_alone(
    db: psycopg.Connection, name: str, shape: str
) -> None:
    body = "select 1" if shape.split()[1] == "sql" else "begin return 1; end"
    with db.transaction(force_rollback=True):
        db.execute(f"create function pgqueue.{name}() returns int {shape} as $${body}$$")
        assert unpinned(db) == [name]
    with db.transaction(force_rollback=True):
        db.execute("create function pgqueue._planted() returns int language sql as 'select 1'")
        assert unpinned(db) == []


def test_claims_and_the_history_are_served_by_their_indexes(db: psycopg.Connection) -> None:
    ids = enqueue_n(db, 20_000, **AS_ROWS)
    finish(db, ids[:15_000], "done", "1 hour")
    finish(db, ids[15_000:15_010], "failed", "1 hour")
    db.execute("analyze pgqueue.jobs; analyze pgqueue.job_history")
    plans = {
        "jobs_claim_idx": "select id from pgqueue.jobs where status = 'queued'"
        " and queue = 'default' and concurrency_key is null and run_after <= now()"
        " order by priority desc, run_after, id limit 10 for update skip locked",
        # pruning: the job list's index (status, finished_at, id) serves it since 1.4.0
        "job_history_list_idx": "select id from pgqueue.job_history"
        " where status in ('done', 'cancelled') and finished_at < now() - interval '7 days'"
        " limit 10000",
        "job_history_kept_idx": "select * from pgqueue.dead_letters",
        "job_history_id_brin": f"select * from pgqueue.job_history where id = {ids[10]}",
    }
    for index, query in plans.items():
        plan = "\n".join(r[0] for r in db.execute(f"explain {query}"))
        assert index in plan, plan


def test_finished_jobs_leave_the_job_table_for_the_history(db: psycopg.Connection) -> None:
    done, dead, cancelled, waiting = enqueue_n(db, 4, **AS_ROWS)
    tokens = {j["id"]: j["lock_token"] for j in claim(db, 2)}
    db.execute("select pgqueue.complete(%s, %s)", (done, tokens[done]))
    db.execute("select pgqueue.fail(%s, %s, 'no', retryable => false)", (dead, tokens[dead]))
    db.execute("select pgqueue.cancel(%s)", (cancelled,))
    assert [r[0] for r in db.execute("select id from pgqueue.jobs")] == [waiting]
    history = db.execute(
        "select id, status, payload, last_error from pgqueue.job_history order by id"
    ).fetchall()
    assert history == [
        (dead, "failed", {"n": 1}, "no"),
        (cancelled, "cancelled", {"n": 2}, None),
    ], "dead letters and cancelled jobs keep their payload, for retry()"
    assert db.execute("select ids, attempts, kind from pgqueue.done_batches").fetchall() == [
        ([done], [1], "test.noop")
    ], "a done job without a key keeps its id, attempts and times, by batch"
    assert job(db, done)["status"] == "done" and job(db, done)["payload"] is None
    assert [r[0] for r in db.execute("select id from pgqueue.dead_letters")] == [dead]
    assert db.execute("select pgqueue.retry(%s)", (dead,)).fetchone() == (True,)
    assert job(db, dead)["status"] == "queued" and job(db, dead)["payload"] == {"n": 1}
    assert (
        db.execute("select count(*) from pgqueue.job_history where id = %s", (dead,)).fetchone()[0]
        == 0
    )
    assert db.execute("select pgqueue.retry(%s)", (done,)).fetchone() == (False,)


def test_enqueue_refuses_a_payload_over_one_mebibyte(db: psycopg.Connection) -> None:
    big = Jsonb({"blob": "x" * 1_100_000})
    with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="the limit is 1 MiB") as err:
        db.execute("select pgqueue.enqueue('import.file', %s)", (big,))
    assert "Storage" in (err.value.diag.message_hint or "")
    with pytest.raises(psycopg.errors.CheckViolation, match="jobs_payload_size_check"):
        db.execute("select pgqueue.enqueue_many(%s)", (Jsonb([{"kind": "k", "payload": big.obj}]),))
    with pytest.raises(psycopg.errors.CheckViolation, match="jobs_payload_size_check"):
        db.execute("insert into pgqueue.jobs (kind, payload) values ('k', %s)", (big,))
    db.execute("select pgqueue.enqueue('fits', %s)", (Jsonb({"blob": "x" * 900_000}),))
    assert db.execute("select count(*) from pgqueue.all_jobs").fetchone() == (1,)


# What a worker, an enqueue or a claim calls once per job or per request, and what those call.
CALLED_PER_JOB_OR_REQUEST = [
    "enqueue", "enqueue_many", "default_max_attempts", "key_holder", "_checked_traceparent",
    "_jobs_wake_workers", "_notify_workers", "_wake", "claim", "complete_and_claim",
    "_runnable_jobs", "_claim_front", "_keyed_candidates", "_free_keys", "_batch_slices",
    "_take", "_take_slices", "_claim_allowance", "_take_tokens", "complete", "complete_many",
    "_complete_jobs", "_end_attempts", "heartbeat", "heartbeat_many",
    "progress", "fail", "backoff", "release", "cancel", "job", "_end_attempt",
    "_unqueue", "_unbatch", "_requeue", "_to_history",
]  # fmt: skip


def test_what_is_called_per_job_or_request_keeps_its_plans_for_the_session(
    db: psycopg.Connection,
) -> None:
    """A function with its own settings (each pins search_path) is never inlined; as SQL,
    PostgreSQL parses and plans its body again on every call from a new statement, such as
    every Data API request. PL/pgSQL keeps its plans for the session."""
    rows = db.execute(
        "select p.proname, l.lanname from pg_proc as p join pg_language as l on l.oid = p.prolang"
        " where p.pronamespace = 'pgqueue'::regnamespace and p.proname = any (%s)",
        (CALLED_PER_JOB_OR_REQUEST,),
    ).fetchall()
    assert {name for name, _ in rows} == set(CALLED_PER_JOB_OR_REQUEST)
    assert [name for name, language in rows if language != "plpgsql"] == []


def test_configuration_is_seeded_from_the_answers(config: dict) -> None:
    assert {k: v for k, v in config.items() if k != "updated_at"} == {
        "max_attempts": 5,
        "lease_seconds": 300,
        "retention_days": 7,
        "dead_letter_retention_days": 28,
        "worker_url": None,
        "worker_url_setting": "app.pgqueue_worker_url",
        "service_key_setting": "app.pgqueue_wake_secret",
        "sweep_schedule": "* * * * *",
        # run-time only, not from the answers (the flow-control migration)
        "default_concurrency_limit": None,
        "key_retention_days": 7,
        "max_result_bytes": 65536,
        # the default answers' supabase transport: no worker LISTENs (the notify migration)
        "notify_listeners": False,
        # the default answers' python style polls when idle (an Edge Function never does)
        "workers_poll": True,
    }


def test_new_jobs_and_claims_follow_the_configuration(db: psycopg.Connection, config) -> None:
    db.execute("""select pgqueue.configure('{"max_attempts": 9, "lease_seconds": 42}')""")
    enqueued = db.execute("select pgqueue.enqueue('a')").fetchone()[0]
    (many,) = db.execute('select pgqueue.enqueue_many(\'[{"kind": "a"}]\')').fetchone()
    inserted = db.execute("insert into pgqueue.jobs (kind) values ('a') returning id").fetchone()[0]
    explicit = db.execute("select pgqueue.enqueue('a', max_attempts => 2)").fetchone()[0]
    attempts = dict(db.execute("select id, max_attempts from pgqueue.all_jobs").fetchall())
    assert [attempts[i] for i in (enqueued, many, inserted, explicit)] == [9, 9, 9, 2]
    leases = db.execute(
        "select extract(epoch from locked_until - locked_at)::int from pgqueue.claim('w', 4)"
    ).fetchall()
    assert leases == [(42,)] * 4
    (token,) = db.execute(
        "update pgqueue.claims set locked_until = now() where %s = any (ids) returning lock_token",
        (enqueued,),
    ).fetchone()
    assert db.execute("select pgqueue.heartbeat(%s, %s)", (enqueued, token)).fetchone()[0]
    (left,) = db.execute(
        "select extract(epoch from locked_until - now())::int from pgqueue.all_jobs where id = %s",
        (enqueued,),
    ).fetchone()
    assert 40 <= left <= 42, "heartbeat without a lease argument renews the configured lease"


def test_sweep_prunes_by_the_configured_retention(db: psycopg.Connection, config) -> None:
    ids = [db.execute("select pgqueue.enqueue('old')").fetchone()[0] for _ in range(2)]
    finish(db, ids[:1], "done", "3 days")
    finish(db, ids[1:], "failed", "3 days")
    assert db.execute("select pruned from pgqueue.sweep()").fetchone()[0] == 0
    db.execute("""select pgqueue.configure('{"retention_days": 2}')""")
    assert db.execute("select pruned from pgqueue.sweep()").fetchone()[0] == 1
    db.execute("""select pgqueue.configure('{"dead_letter_retention_days": 2}')""")
    assert db.execute("select pruned from pgqueue.sweep()").fetchone()[0] == 1


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"lease": 1}, psycopg.errors.InvalidParameterValue, "unknown setting: lease"),
        ({"max_attempts": None}, psycopg.errors.InvalidParameterValue, "cannot be null"),
        ({"max_attempts": 0}, psycopg.errors.CheckViolation, "max_attempts_between_1_and_100"),
        ({"lease_seconds": "soon"}, psycopg.errors.InvalidTextRepresentation, '"soon"'),
        ({"worker_url": "ftp://x"}, psycopg.errors.InvalidParameterValue, "not an http"),
        ({"sweep_schedule": "often"}, psycopg.errors.CheckViolation, "five_cron_fields"),
        ({"service_key_setting": "key"}, psycopg.errors.InvalidParameterValue, "two lowercase"),
        ({"notify_listeners": "maybe"}, psycopg.errors.InvalidTextRepresentation, '"maybe"'),
        ({"notify_listeners": None}, psycopg.errors.InvalidParameterValue, "cannot be null"),
        ({"workers_poll": "often"}, psycopg.errors.InvalidTextRepresentation, '"often"'),
        ({"workers_poll": None}, psycopg.errors.InvalidParameterValue, "cannot be null"),
    ],
)
def test_configure_refuses_bad_settings_and_changes_nothing(
    db: psycopg.Connection, config: dict, changes: dict, error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        db.execute("select pgqueue.configure(%s)", (Jsonb({"retention_days": 3, **changes}),))
    assert db.execute("select pgqueue.configure()").fetchone()[0] == config


def test_a_changed_schedule_reschedules_the_sweeper(db: psycopg.Connection, config) -> None:
    db.execute("""select pgqueue.configure('{"sweep_schedule": "*/7 * * * *"}')""")
    assert db.execute(
        "select schedule, active from cron.job where jobname = 'pgqueue-sweep'"
    ).fetchone() == ("*/7 * * * *", False), "the new schedule; the job's active flag is kept"


OTHER_KEY = "0ther0key" + "0" * 23  # base64, as a wake-up secret must be


def test_wake_ups_follow_the_configured_setting_names_and_url(
    db: psycopg.Connection, config
) -> None:
    # The wake-up is read where it arrives: pg_net may send it before a test could read it
    # from net.http_request_queue.
    with HttpSink() as sink:
        db.execute(
            "select pgqueue.configure(%s)",
            (Jsonb({"service_key_setting": "app.other_key", "worker_url": sink.url}),),
        )
        db.execute(sql.SQL("alter database postgres set app.other_key = {}").format(OTHER_KEY))
        try:
            (request_id,) = db.execute("select pgqueue._wake('test')").fetchone()
            assert request_id is not None
            wait_for_pg_net(db)
        finally:
            db.execute("alter database postgres reset app.other_key")
    assert [(r.path, verified(r, OTHER_KEY)["reason"]) for r in sink.requests] == [
        ("/wake", "test")
    ]


def test_queued_jobs_no_worker_claims_are_listed_as_unclaimed(db: psycopg.Connection) -> None:
    db.execute("truncate pgqueue.workers")
    for kind in ("email", "email", "report", "invoice"):
        db.execute("select pgqueue.enqueue(%s)", (kind,))
    db.execute("select pgqueue.enqueue('email', queue => 'other')")

    def unclaimed() -> list[tuple[str, str, int]]:
        return db.execute(
            "select queue, kind, jobs from pgqueue.unclaimed order by queue, kind"
        ).fetchall()

    assert unclaimed() == [
        ("default", "email", 2),
        ("default", "invoice", 1),
        ("default", "report", 1),
        ("other", "email", 1),
    ]
    db.execute("select pgqueue.checkin('a', 'default', array['email', 'report'])")
    assert unclaimed() == [("default", "invoice", 1), ("other", "email", 1)]
    # a worker checks in again with other kinds: its old ones no longer count
    db.execute("select pgqueue.checkin('a', 'default', array['invoice'])")
    assert unclaimed() == [("default", "email", 2), ("default", "report", 1), ("other", "email", 1)]
    # a worker not seen for 10 minutes claims nothing
    db.execute("select pgqueue.checkin('b', 'default', array['email', 'report'])")
    db.execute(
        "update pgqueue.workers set seen_at = now() - interval '11 minutes' where worker = 'b'"
    )
    assert ("default", "email", 2) in unclaimed()
    # and one not seen for a day is forgotten at the next check-in
    db.execute("update pgqueue.workers set seen_at = now() - interval '2 days' where worker = 'b'")
    db.execute("select pgqueue.checkin('a', 'default', array['invoice'])")
    assert db.execute("select worker from pgqueue.workers").fetchall() == [("a",)]
