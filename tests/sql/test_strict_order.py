"""Strict order per concurrency key (issue 50), on a real PostgreSQL: a key set with
`set_concurrency_limit(key, 1, strict => true)` runs its jobs one at a time in enqueue order,
even across retries: a job that failed and waits for its retry holds the key's later jobs
until it succeeds, is dead-lettered or is cancelled. Keys not in strict order are unchanged."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

import psycopg
import pytest
from psycopg.rows import dict_row

from testkit.cluster import Cluster
from testkit.plans import plans_logged
from tests.sql.test_hot_path import complete_and_claim
from tests.sql.test_queue import enqueue_n
from tests.support.jobs import job_by_id


def ids_of(claimed: list[dict]) -> list[int]:
    return [j["id"] for j in claimed]


def fail(db: psycopg.Connection, claimed: dict, **kw: object) -> str:
    args = "".join(f", {k} => %({k})s" for k in kw)
    (outcome,) = db.execute(
        f"select pgqueue.fail(%(id)s, %(token)s, 'boom'{args})",
        {"id": claimed["id"], "token": claimed["lock_token"], **kw},
    ).fetchone()
    return outcome


def come_due(db: psycopg.Connection, job_id: int) -> None:
    """The job's backoff has passed (as if its time had come)."""
    db.execute(
        "update pgqueue.jobs set run_after = now() - interval '1 second' where id = %s", (job_id,)
    )


def test_a_failed_job_holds_its_strict_keys_later_jobs_until_it_succeeds(
    flow: psycopg.Connection,
) -> None:
    db = flow
    assert db.execute(
        "select pgqueue.set_concurrency_limit('k', 1, strict => true)"
    ).fetchone() == (1,)
    first, second, third = enqueue_n(db, 3, concurrency_key="k")
    (running,) = complete_and_claim(db, max_jobs=10)
    assert running["id"] == first
    assert complete_and_claim(db, max_jobs=10) == [], "one at a time"
    assert fail(db, running, retry_in="1 hour") == "queued"
    assert complete_and_claim(db, max_jobs=10) == [], "the later jobs wait for the retry"
    come_due(db, first)
    (again,) = complete_and_claim(db, max_jobs=10)
    assert (again["id"], again["attempts"]) == (first, 2)
    assert ids_of(complete_and_claim(db, [again], max_jobs=10)) == [second], "then the next"
    assert job_by_id(db, third)["status"] == "queued"


def test_a_dead_letter_or_a_cancel_frees_the_key_at_once(flow: psycopg.Connection) -> None:
    db = flow
    db.execute("select pgqueue.set_concurrency_limit('k', 1, strict => true)")
    ids = enqueue_n(db, 5, concurrency_key="k", max_attempts=2)
    # dead-lettered: not retryable, or out of attempts
    (running,) = complete_and_claim(db, max_jobs=10)
    assert fail(db, running, retryable=False) == "failed"
    (running,) = complete_and_claim(db, max_jobs=10)
    assert running["id"] == ids[1]
    assert fail(db, running, retry_in="1 hour") == "queued"
    assert complete_and_claim(db, max_jobs=10) == []
    come_due(db, ids[1])
    (running,) = complete_and_claim(db, max_jobs=10)
    assert fail(db, running, retry_in="1 hour") == "failed", "its second attempt was its last"
    # cancelled while it waits for its retry, and while it runs
    (running,) = complete_and_claim(db, max_jobs=10)
    assert running["id"] == ids[2]
    fail(db, running, retry_in="1 hour")
    assert complete_and_claim(db, max_jobs=10) == []
    assert db.execute("select pgqueue.cancel(%s)", (ids[2],)).fetchone() == (True,)
    (running,) = complete_and_claim(db, max_jobs=10)
    assert running["id"] == ids[3]
    assert db.execute("select pgqueue.cancel(%s)", (ids[3],)).fetchone() == (True,)
    assert ids_of(complete_and_claim(db, max_jobs=10)) == [ids[4]]
    assert [job_by_id(db, i)["status"] for i in ids] == [
        "failed", "failed", "cancelled", "cancelled", "running",
    ]  # fmt: skip


def test_a_key_limited_to_one_but_not_strict_lets_later_jobs_pass_a_retry(
    flow: psycopg.Connection,
) -> None:
    db = flow
    db.execute("select pgqueue.set_concurrency_limit('k', 1)")
    _, second, _ = enqueue_n(db, 3, concurrency_key="k")
    (running,) = complete_and_claim(db, max_jobs=10)
    assert complete_and_claim(db, max_jobs=10) == [], "one at a time"
    fail(db, running, retry_in="1 hour")
    assert ids_of(complete_and_claim(db, max_jobs=10)) == [second], "the retry falls behind"


def test_strict_order_is_enqueue_order_whatever_the_priority_time_kind_or_queue(
    flow: psycopg.Connection,
) -> None:
    """The key's first live job (lowest id) holds the others wherever it is: due later, of a
    lower priority, of a kind this claim does not take, in another queue."""
    db = flow
    db.execute("select pgqueue.set_concurrency_limit('k', 1, strict => true)")
    (later,) = enqueue_n(db, 1, concurrency_key="k", run_after="2999-01-01T00:00:00Z")
    (urgent,) = enqueue_n(db, 1, concurrency_key="k", priority=10)
    assert complete_and_claim(db, max_jobs=10) == [], "the first is not due"
    db.execute("select pgqueue.cancel(%s)", (later,))
    (other_kind,) = enqueue_n(db, 1, kind="other", concurrency_key="k", priority=20)
    (in_b,) = enqueue_n(db, 1, concurrency_key="k", queue="b")
    (running,) = complete_and_claim(db, max_jobs=10, kinds=["test.noop"])
    assert running["id"] == urgent
    assert complete_and_claim(db, max_jobs=10, queue="b") == [], "the key's first job runs"
    complete_and_claim(db, [running], max_jobs=0)
    assert complete_and_claim(db, max_jobs=10, queue="b") == [], "its first is in another queue"
    assert complete_and_claim(db, max_jobs=10, kinds=["test.noop"]) == [], "of another kind"
    (running,) = complete_and_claim(db, max_jobs=10, kinds=["other"])
    assert running["id"] == other_kind
    assert ids_of(complete_and_claim(db, [running], max_jobs=10, queue="b")) == [in_b]


def test_other_keys_and_unkeyed_jobs_share_a_claim_with_a_strict_key(
    flow: psycopg.Connection,
) -> None:
    db = flow
    db.execute("select pgqueue.set_concurrency_limit('ordered', 1, strict => true)")
    db.execute("select pgqueue.set_concurrency_limit('pair', 2)")
    ordered = enqueue_n(db, 3, concurrency_key="ordered")
    pair = enqueue_n(db, 3, concurrency_key="pair")
    free = enqueue_n(db, 3, concurrency_key="free")
    plain = enqueue_n(db, 3)
    claimed = complete_and_claim(db, max_jobs=100)
    assert sorted(ids_of(claimed)) == sorted([ordered[0], *pair[:2], *free, *plain])
    (nxt,) = complete_and_claim(db, claimed, max_jobs=1)
    assert nxt["id"] in (ordered[1], pair[2])


def test_strict_order_is_set_and_removed_with_the_keys_limit(flow: psycopg.Connection) -> None:
    db = flow

    def setting() -> list[tuple]:
        return db.execute(
            "select max_running, strict from pgqueue.concurrency_limits where concurrency_key = 'k'"
        ).fetchall()

    assert db.execute("select pgqueue.set_concurrency_limit('k', 1, true)").fetchone() == (1,)
    assert setting() == [(1, True)]
    assert db.execute("select pgqueue.set_concurrency_limit('k', 1)").fetchone() == (1,)
    assert setting() == [(1, False)], "a limit set without strict is not strict"
    db.execute("select pgqueue.set_concurrency_limit('k', 1, strict => true)")
    db.execute("select pgqueue.set_concurrency_limit('k', null)")
    assert setting() == []


def test_a_claim_finds_a_strict_keys_first_job_with_one_index_probe(
    flow: psycopg.Connection,
) -> None:
    """However many jobs the key holds, and though its first job, retried, now sorts after
    them in claim order: the claim reads it through jobs_key_order_idx and by its ctid,
    scanning nothing."""
    db = flow
    db.execute("select pgqueue.set_concurrency_limit('ordered', 1, strict => true)")
    first, *_ = enqueue_n(db, 5_000, concurrency_key="ordered")
    enqueue_n(db, 5_000, concurrency_key="other")
    (running,) = [j for j in complete_and_claim(db, max_jobs=10) if j["id"] == first]
    fail(db, running, retry_in="1 hour")
    come_due(db, first)
    db.execute("analyze pgqueue.jobs")
    with plans_logged(db) as plans:
        claimed = complete_and_claim(db, max_jobs=10)
    assert first in ids_of(claimed)
    nested = "\n".join(p for p in plans if "pgqueue.jobs" in p)
    assert "Seq Scan" not in nested, nested
    assert "Index Scan using jobs_key_order_idx" in nested, nested
    assert "Tid Scan" in nested, nested


@pytest.mark.parametrize("max_running", ["2", "null"])
def test_strict_order_needs_a_limit_of_one(flow: psycopg.Connection, max_running: str) -> None:
    with pytest.raises(
        psycopg.errors.InvalidParameterValue,
        match=f"strict order runs one job at a time: max_running must be 1, got {max_running}",
    ):
        flow.execute(f"select pgqueue.set_concurrency_limit('k', {max_running}, strict => true)")
    assert flow.execute("select count(*) from pgqueue.concurrency_limits").fetchone() == (0,)


# -- the test ----------------------------------------------------------------------

STRICT_JOBS = 1_000
FAILS = 0.25  # of attempts, chosen per job and attempt, so every run fails the same ones
LOG = "insert into public.strict_log (job_id, attempt, event) values (%s, %s, %s)"


def fails(job_id: int, attempt: int) -> bool:
    return random.Random(f"{job_id}:{attempt}").random() < FAILS


def test_a_strict_key_keeps_its_order_through_1000_jobs_with_failures_and_4_workers(
    flow: psycopg.Connection, stack: Cluster
) -> None:
    """Four claimers, each on its own connection, work as the workers do: complete_and_claim()
    completes the jobs of the last batch that succeeded and claims the next; a job that fails
    is failed at once with a short retry_in. A quarter of the attempts fail; a job has 3.
    Each attempt of a job of the strict key logs its start (once claimed) and its end (before
    it is completed or failed), numbered by a sequence: in that numbering each attempt starts
    after every earlier job of the key ended, done or dead-lettered."""
    db = flow
    db.execute(
        "drop table if exists public.strict_log;"
        "create table public.strict_log (seq bigserial primary key, job_id bigint not null,"
        " attempt integer not null, event text not null)"
    )
    db.execute("select pgqueue.set_concurrency_limit('ordered', 1, strict => true)")
    keyed = enqueue_n(db, STRICT_JOBS, concurrency_key="ordered", max_attempts=3)
    others = enqueue_n(db, 200) + enqueue_n(db, 200, concurrency_key="loose", max_attempts=3)
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        pause = random.Random(n)
        try:
            with stack.connect(autocommit=True) as conn:
                done: list[dict] = []
                while True:
                    batch = complete_and_claim(conn, done, max_jobs=5)
                    done = []
                    if not batch:
                        (left,) = conn.execute(
                            "select exists (select from pgqueue.jobs)"
                            " or exists (select from pgqueue.claims)"
                        ).fetchone()
                        if not left:
                            return
                        time.sleep(0.002)
                    for claimed in batch:
                        if claimed["concurrency_key"] == "ordered":
                            conn.execute(LOG, (claimed["id"], claimed["attempts"], "start"))
                            time.sleep(pause.random() / 1000)
                            conn.execute(LOG, (claimed["id"], claimed["attempts"], "end"))
                        if fails(claimed["id"], claimed["attempts"]):
                            retry_in = f"{pause.randint(1, 30)} milliseconds"
                            fail(conn, claimed, retry_in=retry_in)
                        else:
                            done.append(claimed)
        except BaseException as exc:
            errors.append(exc)

    started = time.monotonic()
    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors
    assert time.monotonic() - started < 120

    with db.cursor(row_factory=dict_row) as cur:
        events = cur.execute(
            "select job_id, attempt, event from public.strict_log order by seq"
        ).fetchall()
        ended = {
            r["id"]: r
            for r in cur.execute(
                "select id, status, attempts from pgqueue.all_jobs where id = any(%s)",
                (keyed + others,),
            )
        }
    db.execute("drop table public.strict_log")

    # Every job ended once, as the outcomes chosen for its attempts say.
    for job_id in keyed + others:
        attempts = next(a for a in (1, 2, 3) if not fails(job_id, a) or a == 3)
        status = "failed" if fails(job_id, attempts) else "done"
        assert (ended[job_id]["status"], ended[job_id]["attempts"]) == (status, attempts), job_id
    statuses = Counter(ended[i]["status"] for i in keyed)
    assert statuses["failed"] > 0 and statuses["done"] > 900, statuses
    retried = sum(1 for i in keyed if ended[i]["attempts"] > 1)
    assert retried > 100, "many jobs of the key waited for a retry"

    # The key's attempts never overlapped, and came in enqueue order: each job's attempts, its
    # last (its success or its dead letter) the last, before any attempt of a later job.
    assert [e["event"] for e in events] == ["start", "end"] * (len(events) // 2)
    runs = [(e["job_id"], e["attempt"]) for e in events[::2]]
    assert [e["job_id"] for e in events[1::2]] == [j for j, _ in runs]
    expected = [(i, a) for i in keyed for a in range(1, ended[i]["attempts"] + 1)]
    assert runs == expected
