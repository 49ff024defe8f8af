"""The hot path on a real PostgreSQL: complete_and_claim(), and idempotency keys that outlive
the live row now that finished jobs move to the history."""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.rows import dict_row

from testkit.cluster import Cluster
from testkit.plans import plans_logged
from tests.sql.test_queue import AS_ROWS, enqueue_n, expire_lease
from tests.support.jobs import job


def complete_and_claim(
    db: psycopg.Connection, done: list[dict] | None = None, max_jobs: int = 10, **kw
) -> list[dict]:
    """complete_and_claim() for worker 'w', completing the jobs in `done` (rows it returned)."""
    done = done or []
    args = "".join(f", {k} => %({k})s" for k in kw)
    with db.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            "select * from pgqueue.complete_and_claim('w', %(ids)s::bigint[], %(tokens)s::uuid[],"
            f" %(max_jobs)s{args})",
            {
                "ids": [j["id"] for j in done],
                "tokens": [j["lock_token"] for j in done],
                "max_jobs": max_jobs,
                **kw,
            },
        ).fetchall()


def claimers_drain(
    stack: Cluster, claimers: int, max_jobs: int, hold: float = 0.0, wait_for_slots: bool = False
) -> Counter[int]:
    """`claimers` threads, each on its own connection, loop complete_and_claim() (`max_jobs` a
    call, holding each batch `hold` seconds, as a handler would) until it claims nothing; with
    `wait_for_slots`, until no job is left at all (the jobs left may all be of a full key).
    How many times each job id was completed."""
    completed: Counter[int] = Counter()
    errors: list[BaseException] = []
    lock = threading.Lock()

    def claimer() -> None:
        try:
            with stack.connect(autocommit=True) as conn:
                batch: list[dict] = []
                while True:
                    nxt = complete_and_claim(conn, batch, max_jobs=max_jobs)
                    with lock:
                        completed.update(j["id"] for j in batch)
                    batch = nxt
                    if not nxt:
                        left = conn.execute("select count(*) from pgqueue.jobs").fetchone()[0]
                        if not (wait_for_slots and left):
                            return
                        time.sleep(0.01)  # jobs left, all of a full key: wait
                    elif hold:
                        time.sleep(hold)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claimer) for _ in range(claimers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors
    return completed


def test_one_call_completes_the_last_batch_and_claims_the_next(db: psycopg.Connection) -> None:
    ids = enqueue_n(db, 5)
    first = complete_and_claim(db, max_jobs=2)
    assert [j["id"] for j in first] == ids[:2]
    assert set(first[0]) == {
        "id", "kind", "payload", "attempts", "max_attempts", "lock_token", "locked_at",
        "locked_until", "concurrency_key",
    }  # fmt: skip
    assert first[0]["attempts"] == 1 and first[0]["payload"] == {"n": 0}
    second = complete_and_claim(db, first, max_jobs=2)
    assert [j["id"] for j in second] == ids[2:4]
    assert [job(db, i)["status"] for i in ids] == ["done", "done", "running", "running", "queued"]
    assert complete_and_claim(db, second, max_jobs=0) == [], "max_jobs 0 only completes"
    assert [job(db, i)["status"] for i in ids] == ["done"] * 4 + ["queued"]
    assert db.execute(
        "select count(*) from pgqueue.live_jobs where status = 'queued'"
    ).fetchone() == (1,)


def test_a_stale_token_completes_nothing(db: psycopg.Connection) -> None:
    (job_id,) = enqueue_n(db, 1)
    (claimed,) = complete_and_claim(db)
    expire_lease(db, job_id)
    db.execute("select pgqueue.sweep()")
    db.execute("update pgqueue.jobs set run_after = now() where id = %s", (job_id,))
    (again,) = complete_and_claim(db)
    assert again["attempts"] == 2
    assert complete_and_claim(db, [claimed], max_jobs=0) == []
    assert job(db, job_id)["status"] == "running", "the old attempt's token no longer counts"
    complete_and_claim(db, [again], max_jobs=0)
    assert job(db, job_id)["status"] == "done"


def test_it_claims_only_the_given_kinds_of_the_given_queue_for_the_given_lease(
    db: psycopg.Connection,
) -> None:
    enqueue_n(db, 2, kind="a")
    (b,) = enqueue_n(db, 1, kind="b")
    enqueue_n(db, 1, kind="b", queue="other")
    (claimed,) = complete_and_claim(db, kinds=["b"], lease_seconds=30)
    assert claimed["id"] == b
    assert (claimed["locked_until"] - claimed["locked_at"]).total_seconds() == 30


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ("max_jobs => -1", "max_jobs must be between 0 and 10000, got -1"),
        ("max_jobs => 10001", "max_jobs must be between 0 and 10000, got 10001"),
        ("lease_seconds => 0", "lease_seconds must be at least 1, got 0"),
        (
            "done_ids => array[1, 2], done_tokens => array[gen_random_uuid()]",
            "done_ids and done_tokens must have the same length (2 and 1)",
        ),
    ],
)
def test_bad_arguments_are_refused_and_change_nothing(
    db: psycopg.Connection, call: str, message: str
) -> None:
    enqueue_n(db, 1)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=re.escape(message)):
        db.execute(f"select * from pgqueue.complete_and_claim('w', {call})")
    assert db.execute("select status from pgqueue.live_jobs").fetchone() == ("queued",)


def test_four_looping_claimers_run_every_job_exactly_once(
    db: psycopg.Connection, stack: Cluster
) -> None:
    ids = enqueue_n(db, 10_000)
    completed = claimers_drain(stack, claimers=4, max_jobs=50)
    assert sorted(completed) == ids and set(completed.values()) == {1}
    assert db.execute(
        "select status, attempts, count(*) from pgqueue.all_jobs group by 1, 2"
    ).fetchall() == [("done", 1, 10_000)]
    assert db.execute("select count(*) from pgqueue.jobs").fetchone() == (0,)


def test_a_key_stays_taken_after_its_job_finished_until_the_history_is_pruned(
    db: psycopg.Connection,
) -> None:
    first = db.execute("select pgqueue.enqueue('mail', idempotency_key => 'k1')").fetchone()[0]
    (claimed,) = complete_and_claim(db)
    complete_and_claim(db, [claimed], max_jobs=0)
    again = db.execute("select pgqueue.enqueue('mail', idempotency_key => 'k1')").fetchone()[0]
    assert again == first
    many = db.execute(
        "select pgqueue.enqueue_many(%s)",
        (psycopg.types.json.Jsonb([{"kind": "mail", "idempotency_key": "k1"}, {"kind": "x"}]),),
    ).fetchall()
    assert many[0][0] == first
    assert db.execute("select count(*) from pgqueue.jobs where kind = 'mail'").fetchone() == (0,)

    db.execute("update pgqueue.job_history set finished_at = now() - interval '30 days'")
    db.execute("select pgqueue.sweep()")
    fresh = db.execute("select pgqueue.enqueue('mail', idempotency_key => 'k1')").fetchone()[0]
    assert fresh != first and job(db, fresh)["status"] == "queued"


def enqueue_racing(stack: Cluster, key: str, results: list[int]) -> threading.Thread:
    """A thread that enqueues a job with idempotency key `key` on a connection of its own and
    appends the id it gets to `results`."""

    def enqueue() -> None:
        with stack.connect(autocommit=True) as conn:
            (job_id,) = conn.execute(
                "select pgqueue.enqueue('mail', idempotency_key => %s)", (key,)
            ).fetchone()
            results.append(job_id)

    racer = threading.Thread(target=enqueue)
    racer.start()
    return racer


def test_a_key_whose_job_finishes_while_an_enqueue_runs_is_not_doubled(
    db: psycopg.Connection, stack: Cluster
) -> None:
    first = db.execute("select pgqueue.enqueue('mail', idempotency_key => 'k2')").fetchone()[0]
    (claimed,) = complete_and_claim(db)
    results: list[int] = []
    with stack.connect() as finisher:
        # The worker's completion is in flight: the claim still holds the key for others, and
        # the job's history row is not yet visible to them.
        complete_and_claim(finisher, [claimed], max_jobs=0)
        racer = enqueue_racing(stack, "k2", results)
        racer.join(10)
        assert results == [first], "the running job holds the key"
        finisher.commit()
    racer = enqueue_racing(stack, "k2", results)
    racer.join(10)
    assert results == [first, first], "and its history row, once it is done"
    assert db.execute("select count(*) from pgqueue.jobs").fetchone() == (0,)
    assert db.execute("select count(*) from pgqueue.all_jobs").fetchone() == (1,)


def test_a_key_whose_job_is_claimed_while_an_enqueue_waits_on_it_is_not_doubled(
    db: psycopg.Connection, stack: Cluster
) -> None:
    first = db.execute("select pgqueue.enqueue('mail', idempotency_key => 'k3')").fetchone()[0]
    results: list[int] = []
    with stack.connect() as claimer:
        # The claim is in flight: the row holding the key is deleted, not yet committed, and
        # the claim's hold on the key not yet visible to others.
        (claimed,) = complete_and_claim(claimer)
        racer = enqueue_racing(stack, "k3", results)
        racer.join(1)
        assert racer.is_alive(), "the enqueue waits on the key's row"
        claimer.commit()
        racer.join(10)
    assert results == [first]
    assert claimed["id"] == first
    assert db.execute("select count(*) from pgqueue.jobs").fetchone() == (0,)
    assert db.execute("select id, status from pgqueue.all_jobs").fetchall() == [(first, "running")]


def plans_of_a_steady_call(db: psycopg.Connection) -> str:
    """The plans (auto_explain, nested statements included) of the statements on pgqueue.jobs
    and pgqueue.claims of one complete_and_claim() call made after eight others on the same
    connection."""
    batch: list[dict] = []
    for _ in range(8):
        batch = complete_and_claim(db, batch, max_jobs=100)
    with plans_logged(db) as plans:
        complete_and_claim(db, batch, max_jobs=100)
    return "\n".join(p for p in plans if "pgqueue.jobs" in p or "pgqueue.claims" in p)


def test_no_statement_of_the_hot_path_scans_the_job_table(db: psycopg.Connection) -> None:
    enqueue_n(db, 5_000, **AS_ROWS)
    enqueue_n(db, 5_000, queue="other", concurrency_key="k")  # keyed jobs elsewhere
    db.execute("analyze pgqueue.jobs")
    nested = plans_of_a_steady_call(db)
    assert "Seq Scan" not in nested, nested
    assert "Index Scan using claims_pkey" in nested, "completions find their claim by its token"
    assert "Index Scan using jobs_claim_idx" in nested, "claims take jobs in claim order"
    assert "Tid Scan" in nested, "and delete the rows they locked by ctid"


def test_claim_reads_its_jobs_back_without_scanning_the_queue(db: psycopg.Connection) -> None:
    """claim() returns whole job rows: it reads them from its own claim, by the claim's key,
    not by looking for its token among the queued jobs."""
    enqueue_n(db, 5_000, **AS_ROWS)
    db.execute("analyze pgqueue.jobs")
    with plans_logged(db) as plans:
        claimed = db.execute("select status, lock_token from pgqueue.claim('w', 100)").fetchall()
    nested = "\n".join(plans)
    assert len(claimed) == 100 and set(claimed) == {("running", claimed[0][1])}
    assert "Seq Scan on jobs" not in nested, nested


@pytest.mark.parametrize("where", ["status = 'running'", "lock_token = gen_random_uuid()"])
def test_live_jobs_finds_running_jobs_without_reading_the_queue(
    db: psycopg.Connection, where: str
) -> None:
    """jobs_queued_check says no queued row runs or holds a token, so the planner leaves the
    job table out of such a query on live_jobs (constraint exclusion of a UNION ALL branch)."""
    enqueue_n(db, 2_000, **AS_ROWS)
    db.execute("analyze pgqueue.jobs")
    plan = "\n".join(
        r[0] for r in db.execute(f"explain select * from pgqueue.live_jobs where {where}")
    )
    assert " on jobs " not in plan and " on claims " in plan, plan
    # and the answer is the claims' jobs, as before
    (token,) = db.execute("select lock_token from pgqueue.claim('w', 3) limit 1").fetchone()
    asked = where.replace("gen_random_uuid()", "%s")
    rows = db.execute(
        f"select lock_token from pgqueue.live_jobs where {asked}",
        (token,) if "lock_token" in where else (),
    ).fetchall()
    assert rows == [(token,)] * 3


def test_a_claim_deletes_its_jobs_and_a_heartbeat_renews_one_row(db: psycopg.Connection) -> None:
    def writes(table: str) -> tuple[int, int, int]:
        """Rows of `table` updated, HOT-updated and deleted so far."""
        db.execute("select pg_stat_force_next_flush()")
        row = db.execute(
            "select n_tup_upd, n_tup_hot_upd, n_tup_del from pg_stat_user_tables"
            " where relid = %s::regclass",
            (table,),
        ).fetchone()
        assert row is not None
        return row

    enqueue_n(db, 200, **AS_ROWS)
    jobs_before, claims_before = writes("pgqueue.jobs"), writes("pgqueue.claims")
    batch = complete_and_claim(db, max_jobs=100)
    for claimed in batch[:10]:
        db.execute("select pgqueue.heartbeat(%s, %s)", (claimed["id"], claimed["lock_token"]))
    jobs = [a - b for a, b in zip(writes("pgqueue.jobs"), jobs_before, strict=True)]
    claims = [a - b for a, b in zip(writes("pgqueue.claims"), claims_before, strict=True)]
    assert (jobs[0], jobs[2]) == (0, 100), "a claim writes no new version of its jobs' rows"
    assert db.execute("select count(*) from pgqueue.claims").fetchone() == (1,)
    assert len({j["lock_token"] for j in batch}) == 1, "one token per claim"
    updated, hot, _ = claims
    assert updated == 10, "each heartbeat renews the claim's one row"
    # (no index names the lease: with room on the page, no index entry either)
    assert hot >= 8, "HOT updates"


def heartbeat_many(db: psycopg.Connection, jobs: list[dict], lease: int = 300) -> list[int]:
    (running,) = db.execute(
        "select pgqueue.heartbeat_many(%s::bigint[], %s::uuid[], %s)",
        ([j["id"] for j in jobs], [j["lock_token"] for j in jobs], lease),
    ).fetchone()
    return running


def lease_left(db: psycopg.Connection, token: object) -> float:
    (left,) = db.execute(
        "select extract(epoch from locked_until - now()) from pgqueue.claims where lock_token = %s",
        (token,),
    ).fetchone()
    return float(left)


def test_heartbeat_many_renews_each_claim_once_and_names_the_jobs_still_running(
    db: psycopg.Connection,
) -> None:
    enqueue_n(db, 30)
    first = complete_and_claim(db, max_jobs=10, lease_seconds=5)
    second = complete_and_claim(db, max_jobs=10, lease_seconds=5)
    assert len({j["lock_token"] for j in first + second}) == 2
    cancelled, rescued = first[3], second[0]
    assert db.execute("select pgqueue.cancel(%s)", (cancelled["id"],)).fetchone() == (True,)
    # A stale token: the job runs (in `second`), but not under the token asked about.
    stale = {**second[1], "lock_token": first[0]["lock_token"]}
    db.execute("select pg_stat_force_next_flush()")
    updates = db.execute(
        "select n_tup_upd from pg_stat_user_tables where relid = 'pgqueue.claims'::regclass"
    ).fetchone()[0]

    running = heartbeat_many(db, [*first, *second, stale])

    assert running == sorted(j["id"] for j in first + second if j is not cancelled)
    assert running.count(stale["id"]) == 1, "once, under its own token; not under the stale one"
    assert 295 <= lease_left(db, first[0]["lock_token"]) <= 300
    assert 295 <= lease_left(db, second[0]["lock_token"]) <= 300
    # Each claim's row once, not once a job.
    db.execute("select pg_stat_force_next_flush()")
    after = db.execute(
        "select n_tup_upd from pg_stat_user_tables where relid = 'pgqueue.claims'::regclass"
    ).fetchone()[0]
    assert after - updates == 2

    # The sweeper takes `second` back once its lease runs out: none of its jobs runs now.
    expire_lease(db, rescued["id"])
    db.execute("select pgqueue.sweep()")
    assert heartbeat_many(db, [*first, *second]) == sorted(
        j["id"] for j in first if j is not cancelled
    )
    assert heartbeat_many(db, []) == []


def test_heartbeat_many_refuses_ids_and_tokens_that_do_not_pair_up(
    db: psycopg.Connection,
) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="2 job ids but 1 lock tokens"):
        db.execute(
            "select pgqueue.heartbeat_many(%s::bigint[], %s::uuid[])",
            ([1, 2], ["00000000-0000-0000-0000-000000000000"]),
        )


def test_heartbeat_never_shortens_a_lease(db: psycopg.Connection) -> None:
    enqueue_n(db, 1)
    (claimed,) = complete_and_claim(db, max_jobs=1, lease_seconds=600)
    assert heartbeat_many(db, [claimed], lease=10) == [claimed["id"]]
    assert lease_left(db, claimed["lock_token"]) > 590
    assert db.execute(
        "select pgqueue.heartbeat(%s, %s, 10)", (claimed["id"], claimed["lock_token"])
    ).fetchone() == (True,)
    assert lease_left(db, claimed["lock_token"]) > 590


def test_no_statement_of_a_keyed_claim_scans_the_job_table(db: psycopg.Connection) -> None:
    enqueue_n(db, 3_000, concurrency_key="big")
    enqueue_n(db, 3_000)
    for key in range(20):
        enqueue_n(db, 5, concurrency_key=f"small-{key}")
    db.execute("select pgqueue.set_concurrency_limit('small-1', 2)")
    db.execute("analyze pgqueue.jobs")
    try:
        nested = plans_of_a_steady_call(db)
    finally:
        db.execute("truncate pgqueue.concurrency_limits, pgqueue.running_keys")
    assert "jobs_concurrency_idx" in nested and "jobs_claim_idx" in nested, nested
    assert "Seq Scan on jobs" not in nested, nested


# -- The claim front: a session's claim reads on from where its last claim ended ---------------


def claim_index_pages(conn: psycopg.Connection) -> int:
    """Pages of jobs_claim_idx that `conn`'s open transaction has read so far."""
    return conn.execute(
        "select pg_stat_get_xact_blocks_fetched('pgqueue.jobs_claim_idx'::regclass)"
    ).fetchone()[0]


@pytest.fixture
def no_autovacuum(db: psycopg.Connection) -> Iterator[None]:
    """No autovacuum of pgqueue.jobs during the test (it is put back after): one that came in
    the middle (0.02 of the table's rows changed is enough) would take away the dead index
    entries the test is about."""
    db.execute("alter table pgqueue.jobs set (autovacuum_enabled = false)")
    try:
        yield
    finally:
        db.execute("alter table pgqueue.jobs reset (autovacuum_enabled)")


def test_a_claim_reads_on_from_the_session_s_last_claim_not_past_the_dead_entries(
    db: psycopg.Connection, stack: Cluster, no_autovacuum: None
) -> None:
    """Each claimed job leaves a dead entry at the head of the claim index until VACUUM. A
    session's first claim walks them; its next one starts where the last ended."""
    ids = enqueue_n(db, 12_000, **AS_ROWS)
    batch: list[dict] = []
    for _ in range(100):  # 10,000 jobs claimed, their index entries dead
        batch = complete_and_claim(db, batch, max_jobs=100)
    with stack.connect() as conn, conn.transaction():  # one transaction: one now()
        start = claim_index_pages(conn)
        first = complete_and_claim(conn, max_jobs=100)
        walked = claim_index_pages(conn) - start
        second = complete_and_claim(conn, max_jobs=100)
        read_on = claim_index_pages(conn) - start - walked
    assert sorted(j["id"] for j in first + second) == ids[10_000:10_200], "in claim order"
    assert walked >= 30, "a first claim reads from the head of the queue"
    assert read_on <= 8, f"the next one read {read_on} pages, not from its front"


def test_higher_priorities_keep_their_precedence_over_the_front(db: psycopg.Connection) -> None:
    ids = enqueue_n(db, 300, **AS_ROWS)
    with db.transaction():
        assert sorted(j["id"] for j in complete_and_claim(db, max_jobs=100)) == ids[:100]
        urgent = db.execute("select pgqueue.enqueue('k', priority => 5)").fetchone()[0]
        later = complete_and_claim(db, max_jobs=100)
    # (a claim returns its jobs in no particular order; claim order decides which it takes)
    assert sorted(j["id"] for j in later) == sorted([urgent, *ids[100:199]])
    # and after them, the lower priorities the front's own left over
    low = db.execute("select pgqueue.enqueue('k', priority => -1)").fetchone()[0]
    rest = complete_and_claim(db, max_jobs=300)
    assert sorted(j["id"] for j in rest) == [*ids[199:], low]


def test_a_job_placed_behind_the_front_waits_for_the_next_claim_from_the_head(
    db: psycopg.Connection,
) -> None:
    """A job due earlier than the last one claimed (a run_after in the past, an enqueue whose
    transaction started before and committed after the claim) is taken by the next claim that
    reads from the head of the queue: one that would not fill its batch from the front, or the
    first after 100 ms."""
    ids = enqueue_n(db, 1_000, **AS_ROWS)
    with db.transaction():
        assert sorted(j["id"] for j in complete_and_claim(db, max_jobs=100)) == ids[:100]
        behind = db.execute(
            "select pgqueue.enqueue('k', run_after => now() - interval '1 hour')"
        ).fetchone()[0]
        taken = complete_and_claim(db, max_jobs=100)
        assert sorted(j["id"] for j in taken) == ids[100:200], "not yet: behind the front"
    time.sleep(0.15)
    assert sorted(j["id"] for j in complete_and_claim(db, max_jobs=100)) == [*ids[200:299], behind]
    with db.transaction():
        late = db.execute(
            "select pgqueue.enqueue('k', run_after => now() - interval '1 hour')"
        ).fetchone()[0]
        rest = complete_and_claim(db, max_jobs=1_000)
    assert sorted(j["id"] for j in rest) == [*ids[299:], late], "a claim the front cannot fill"


def set_front(conn: psycopg.Connection, job_id: int, scope: str = "* default") -> None:
    """Set `conn`'s claim front by hand, at job `job_id` (priority 0), as if its last read from
    the head of the queue were now: valid for the claims of its open transaction."""
    conn.execute(
        "select set_config('pgqueue.claim_front', concat_ws(' ',"
        " (extract(epoch from now()) * 1e6)::bigint, 0,"
        " (extract(epoch from j.run_after) * 1e6)::bigint, j.id, %s::text), false)"
        " from pgqueue.live_jobs as j where j.id = %s",
        (scope, job_id),
    )


def claim_index_tuples(conn: psycopg.Connection) -> int:
    """Rows of pgqueue.jobs that `conn`'s open transaction has fetched through jobs_claim_idx."""
    return conn.execute(
        "select pg_stat_get_xact_tuples_fetched('pgqueue.jobs_claim_idx'::regclass)"
    ).fetchone()[0]


def test_a_claim_reads_on_from_the_front_a_concurrent_claim_published(
    db: psycopg.Connection, stack: Cluster
) -> None:
    """A claim publishes its front before it commits: a concurrent claim reads on from there
    instead of trying each job the first one holds and skipping it. If the first rolls back,
    its jobs lie behind both fronts, and the next claim from the head takes them."""
    ids = enqueue_n(db, 300, **AS_ROWS)
    with stack.connect() as a, stack.connect() as b:
        with a.transaction(force_rollback=True):
            assert sorted(j["id"] for j in complete_and_claim(a, max_jobs=100)) == ids[:100]
            with b.transaction():
                set_front(b, ids[0])  # b's own front: behind all of a's jobs
                before = claim_index_tuples(b)
                taken = complete_and_claim(b, max_jobs=10)
                fetched = claim_index_tuples(b) - before
            assert sorted(j["id"] for j in taken) == ids[100:110]
            assert fetched <= 12, f"fetched {fetched} rows: it tried a's jobs"
        # a rolled back: its jobs are queued again, behind every front
        with b.transaction():
            set_front(b, ids[109])
            assert sorted(j["id"] for j in complete_and_claim(b, max_jobs=10)) == ids[110:120]
    assert sorted(j["id"] for j in complete_and_claim(db, max_jobs=100)) == ids[:100]


def test_a_front_published_for_other_kinds_is_not_read_from(
    db: psycopg.Connection, stack: Cluster
) -> None:
    """A claim of kind a must not start from where a claim of kind b ended: the jobs of kind a
    before that place are nobody's."""
    ids = [enqueue_n(db, 1, kind=kind, **AS_ROWS)[0] for _ in range(60) for kind in "ab"]
    a_jobs, b_jobs = ids[0::2], ids[1::2]
    with stack.connect() as a, stack.connect() as b, a.transaction(force_rollback=True):
        taken_b = complete_and_claim(a, max_jobs=40, kinds=["b"])
        assert sorted(j["id"] for j in taken_b) == b_jobs[:40]
        with b.transaction(force_rollback=True):
            set_front(b, a_jobs[0], scope="{a} default")
            taken_a = complete_and_claim(b, max_jobs=10, kinds=["a"])
        assert sorted(j["id"] for j in taken_a) == a_jobs[1:11]


def test_completions_find_their_claim_by_its_index_after_claims_is_vacuumed_empty(
    db: psycopg.Connection, stack: Cluster
) -> None:
    """Vacuumed while no claim is open (autovacuum, on a quiet queue), claims has statistics
    that say it is empty. A completion planned then must still find its claim through
    claims_pkey: read whole, claims holds every claim completed since the last vacuum."""
    enqueue_n(db, 2_000, **AS_ROWS)
    db.execute("vacuum analyze pgqueue.claims")
    assert db.execute(
        "select relpages, reltuples from pg_class where oid = 'pgqueue.claims'::regclass"
    ).fetchone() == (0, 0)
    with stack.connect(autocommit=True) as conn:  # plans are made per connection
        nested = plans_of_a_steady_call(conn)
    assert "Seq Scan on claims" not in nested, nested
    assert "Index Scan using claims_pkey" in nested, nested


@pytest.mark.parametrize(
    "setting",
    [
        "rubbish",
        "1 2 3 4",
        "1 99999999999 3 4 * default",  # numbers too large to cast
        # a front that would skip every job: for other kinds, another queue, or stale
        "{now} 0 {far} 999999999999 {{other}} default",
        "{now} 0 {far} 999999999999 * elsewhere",
        "{old} 0 {far} 999999999999 * default",
    ],
)
def test_a_front_that_is_malformed_or_not_this_claim_s_is_ignored(
    db: psycopg.Connection, setting: str
) -> None:
    ids = enqueue_n(db, 5, **AS_ROWS)
    now_us = db.execute("select (extract(epoch from now()) * 1e6)::bigint").fetchone()[0]
    far = now_us + 3_600 * 10**6
    with db.transaction():
        db.execute(
            "select set_config('pgqueue.claim_front', %s, false)",
            (setting.format(now=now_us, old=now_us - 10**6, far=far),),
        )
        assert sorted(j["id"] for j in complete_and_claim(db, max_jobs=10)) == ids


def test_a_finished_batch_keeps_its_ids_compressed_with_lz4(db: psycopg.Connection) -> None:
    """A done batch of 100 is past the size at which its largest value, the ids, is compressed:
    with lz4, cheaper than the default pglz on every completion."""
    ids = enqueue_n(db, 100)
    batch = complete_and_claim(db, max_jobs=100)
    complete_and_claim(db, batch, max_jobs=0)
    assert db.execute(
        "select ids, pg_column_compression(ids) from pgqueue.done_batches"
    ).fetchall() == [(ids, "lz4")]


def test_queued_jobs_fill_the_table_s_pages(db: psycopg.Connection) -> None:
    """Since a claim deletes its jobs instead of updating them, nothing needs room beside a job
    on its page: jobs enqueued fill their pages, not half of each as the hot-path migration's
    fillfactor left them."""
    enqueue_n(db, 2000, **AS_ROWS)
    pages, row_bytes = db.execute(
        "select count(distinct (ctid::text::point)[0]), sum(pg_column_size(j.*) + 4)"
        " from pgqueue.jobs as j"
    ).fetchone()
    # Each row also takes its alignment padding, and each page its header: over 80% of the
    # pages' bytes are rows, where half-empty pages would hold at most 50%.
    assert row_bytes / (pages * 8192) > 0.8
