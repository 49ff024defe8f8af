"""Jobs enqueued together stored as one row (job_batches): which calls take the
batch path, how claims take slices merged with the rows of pgqueue.jobs in claim order, and
every reader of queued jobs seeing them one by one."""

from __future__ import annotations

import psycopg
import pytest
from psycopg.types.json import Jsonb

from testkit.cluster import Cluster
from tests.sql.test_hot_path import claimers_drain, complete_and_claim
from tests.sql.test_queue import expire_lease
from tests.support.jobs import job_by_id as job


def enqueue_many(db: psycopg.Connection, jobs: list[dict]) -> list[int]:
    return [r[0] for r in db.execute("select pgqueue.enqueue_many(%s)", (Jsonb(jobs),))]


def batches(db: psycopg.Connection) -> list[tuple]:
    """(first_id, queue, kind, size, taken) of every batch, in id order."""
    return db.execute(
        "select first_id, queue, kind, size, taken from pgqueue.job_batches order by first_id"
    ).fetchall()


def rows(db: psycopg.Connection) -> int:
    return db.execute("select count(*) from pgqueue.jobs").fetchone()[0]


def live(db: psycopg.Connection) -> list[tuple]:
    """(id, status, payload) of every live job, in id order."""
    return db.execute("select id, status, payload from pgqueue.live_jobs order by id").fetchall()


def test_one_kind_and_queue_with_nothing_else_set_is_stored_as_one_row(
    db: psycopg.Connection,
) -> None:
    ids = enqueue_many(
        db,
        [
            {"kind": "mail", "payload": {"n": 1}},
            {"kind": "mail", "payload": None},
            {"kind": "mail", "queue": "default", "unknown": 1},  # ignored, as by the rows
        ],
    )
    assert ids == [ids[0], ids[0] + 1, ids[0] + 2]
    assert batches(db) == [(ids[0], "default", "mail", 3, 0)]
    assert rows(db) == 0
    assert live(db) == [
        (ids[0], "queued", {"n": 1}),
        (ids[1], "queued", {}),
        (ids[2], "queued", {}),
    ]
    assert job(db, ids[0]) | {"created_at": None, "run_after": None} == {
        "id": ids[0],
        "queue": "default",
        "kind": "mail",
        "status": "queued",
        "priority": 0,
        "attempts": 0,
        "max_attempts": db.execute("select pgqueue.default_max_attempts()").fetchone()[0],
        "payload": {"n": 1},
        "progress": None,
        "result": None,
        "last_error": None,
        "concurrency_key": None,
        "idempotency_key": None,
        "run_after": None,
        "locked_until": None,
        "created_at": None,
        "finished_at": None,
        "errors": [],
        "snoozes": 0,
        "depends_on": [],
        "dependents": [],
        "workflow_id": None,
    }
    stats = db.execute(
        "select queue, kind, status, jobs, runnable from pgqueue.stats where status = 'queued'"
    ).fetchall()
    assert stats == [("default", "mail", "queued", 3, 3)]
    assert db.execute("select queue, kind, jobs from pgqueue.unclaimed").fetchall() == [
        ("default", "mail", 3)
    ]


def test_a_named_queue_is_kept_and_a_call_over_1024_jobs_takes_a_block_of_ids_per_batch(
    db: psycopg.Connection,
) -> None:
    ids = enqueue_many(db, [{"kind": "k", "queue": "q2", "payload": {"n": i}} for i in range(2500)])
    assert len(ids) == 2500 and ids == sorted(ids) and len(set(ids)) == 2500
    found = batches(db)
    assert [(q, k, size, taken) for _, q, k, size, taken in found] == [
        ("q2", "k", 1024, 0),
        ("q2", "k", 1024, 0),
        ("q2", "k", 452, 0),
    ]
    # each batch's ids are contiguous, and each batch's first id starts a new block
    assert ids == [i for first, *_, size, _ in found for i in range(first, first + size)]
    assert [b[0] - found[0][0] for b in found] == [0, 1024, 2048]
    payloads = [p["n"] for _, _, p in live(db)]
    assert payloads == list(range(2500))
    # a job enqueued alone afterwards takes the next block's first id
    single = db.execute("select pgqueue.enqueue('k', '{}')").fetchone()[0]
    assert single == found[0][0] + 3 * 1024


def test_a_field_set_to_null_after_the_first_element_counts_as_not_set(
    db: psycopg.Connection,
) -> None:
    """As the row path takes it (coalesce to the default): the batch path reads every
    element's fields as text in one pass, where a null is no value."""
    jobs = [{"kind": "a"}, {"kind": "a", "queue": None, "priority": None, "run_after": None}]
    ids = enqueue_many(db, jobs)
    assert [(q, k, size) for _, q, k, size, _ in batches(db)] == [("default", "a", 2)]
    assert rows(db) == 0 and len(ids) == 2


@pytest.mark.parametrize(
    "jobs",
    [
        [{"kind": "a"}, {"kind": "b"}],
        [{"kind": "a"}, {"kind": "a", "queue": "other"}],
        [{"kind": "a", "queue": "other"}, {"kind": "a"}],
        [{"kind": "a"}, {"kind": "a", "priority": 5}],
        [{"kind": "a", "run_after": "2000-01-01T00:00:00Z"}],
        [{"kind": "a", "max_attempts": 2}],
        [{"kind": "a", "idempotency_key": "once"}],
        [{"kind": "a", "concurrency_key": "tenant"}],
        [{"kind": "a", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}],
        [{"kind": "a", "queue": None}],
    ],
    ids=[
        "two kinds",
        "two queues",
        "a queue then none",
        "a priority",
        "a run_after",
        "max_attempts",
        "a key",
        "a concurrency key",
        "a trace",
        "a null queue",
    ],
)
def test_anything_else_is_stored_a_row_a_job_as_before(
    db: psycopg.Connection, jobs: list[dict]
) -> None:
    ids = enqueue_many(db, jobs)
    assert len(ids) == len(jobs)
    assert batches(db) == []
    assert rows(db) == len(jobs)


@pytest.mark.parametrize(
    "jobs, error",
    [
        ([{"kind": "a"}, {"kind": ""}], "jobs_kind_check"),
        ([{"kind": "a"}, {"payload": {}}], 'null value in column "kind"'),
        ([{"kind": ""}, {"kind": ""}], "jobs_kind_check"),
        ([{"kind": "x" * 201}], "jobs_kind_check"),
        ([{"kind": "a", "queue": ""}], "jobs_queue_check"),
        ([{"kind": "a"}, 5], "array of objects"),
    ],
    ids=[
        "an empty kind",
        "no kind",
        "all kinds empty",
        "a long kind",
        "an empty queue",
        "a number",
    ],
)
def test_a_bad_element_is_refused_as_before_and_nothing_is_stored(
    db: psycopg.Connection, jobs: list, error: str
) -> None:
    with pytest.raises(psycopg.Error, match=error):
        enqueue_many(db, jobs)
    assert batches(db) == [] and rows(db) == 0


def test_claims_take_slices_in_order_and_complete_them_as_other_jobs(
    db: psycopg.Connection,
) -> None:
    ids = enqueue_many(db, [{"kind": "k", "payload": {"n": i}} for i in range(25)])

    def claim(done: list[dict]) -> list[dict]:
        return sorted(complete_and_claim(db, done, max_jobs=10), key=lambda j: j["id"])

    first = claim([])
    assert [j["id"] for j in first] == ids[:10]
    assert [j["payload"] for j in first] == [{"n": i} for i in range(10)]
    assert {j["attempts"] for j in first} == {1}
    assert batches(db) == [(ids[0], "default", "k", 25, 10)]
    assert [s for _, s, _ in live(db)] == ["running"] * 10 + ["queued"] * 15
    second = claim(first)
    assert [j["id"] for j in second] == ids[10:20]
    assert job(db, ids[0])["status"] == "done"
    third = claim(second)
    assert [j["id"] for j in third] == ids[20:]
    assert batches(db) == []
    assert complete_and_claim(db, third, max_jobs=10) == []
    done = db.execute("select count(*) from pgqueue.all_jobs where status = 'done'").fetchone()
    assert done == (25,)


def test_a_claim_merges_batches_and_rows_in_claim_order(db: psycopg.Connection) -> None:
    early = enqueue_many(db, [{"kind": "k", "priority": 0}])  # a row, due first
    batch = enqueue_many(db, [{"kind": "k"} for _ in range(3)])
    urgent = enqueue_many(db, [{"kind": "k", "priority": 1}])  # a row, a higher priority
    late = enqueue_many(db, [{"kind": "k", "priority": 0}])  # a row, due after the batch
    low = enqueue_many(db, [{"kind": "k", "priority": -1}])  # a row, a lower priority
    # (a claim returns its jobs in no particular order)
    claimed = complete_and_claim(db, max_jobs=4)
    assert {j["id"] for j in claimed} == {*urgent, *early, *batch[:2]}
    claimed = complete_and_claim(db, claimed, max_jobs=4)
    assert {j["id"] for j in claimed} == {*batch[2:], *late, *low}
    assert batches(db) == [] and rows(db) == 0


def test_claims_keep_to_their_kinds_queue_and_a_paused_queue(db: psycopg.Connection) -> None:
    a = enqueue_many(db, [{"kind": "a"} for _ in range(3)])
    b = enqueue_many(db, [{"kind": "b", "queue": "other"} for _ in range(3)])
    assert complete_and_claim(db, max_jobs=10, kinds=["b"]) == []
    assert [j["id"] for j in complete_and_claim(db, max_jobs=10, queue="other")] == b
    db.execute("select pgqueue.pause('default')")
    assert complete_and_claim(db, max_jobs=10) == []
    db.execute("select pgqueue.resume('default')")
    assert [j["id"] for j in complete_and_claim(db, max_jobs=10, kinds=["a"])] == a


def test_four_claimers_run_every_batched_job_exactly_once(
    db: psycopg.Connection, stack: Cluster
) -> None:
    ids = []
    for _ in range(6):
        ids += enqueue_many(db, [{"kind": "k"} for _ in range(1000)])
    ids += enqueue_many(db, [{"kind": "k", "priority": 0} for _ in range(500)])  # rows
    completed = claimers_drain(stack, claimers=4, max_jobs=100)
    assert sorted(completed) == sorted(ids)
    assert set(completed.values()) == {1}
    assert batches(db) == [] and rows(db) == 0


@pytest.mark.parametrize("position", [0, 1, 4, 9])
def test_a_job_cancelled_out_of_a_batch_leaves_the_others_queued(
    db: psycopg.Connection, position: int
) -> None:
    ids = enqueue_many(db, [{"kind": "k", "payload": {"n": i}} for i in range(10)])
    complete_and_claim(db, max_jobs=1)  # the first is running
    if position == 0:
        assert db.execute("select pgqueue.cancel(%s)", (ids[0],)).fetchone() == (True,)
        assert job(db, ids[0])["status"] == "cancelled"
        position = 1  # and a queued one next
    cancelled = ids[position]
    assert db.execute("select pgqueue.cancel(%s)", (cancelled,)).fetchone() == (True,)
    assert db.execute("select pgqueue.cancel(%s)", (cancelled,)).fetchone() == (False,)
    gone = job(db, cancelled)
    assert (gone["status"], gone["payload"], gone["attempts"]) == (
        "cancelled",
        {"n": position},
        0,
    )
    queued = [i for i, s, _ in live(db) if s == "queued"]
    assert queued == [i for i in ids[1:] if i != cancelled]
    assert [job(db, i)["payload"] for i in queued] == [{"n": ids.index(i)} for i in queued]
    claimed = sorted(complete_and_claim(db, max_jobs=20), key=lambda j: j["id"])
    assert [j["id"] for j in claimed] == queued
    assert [j["payload"] for j in claimed] == [{"n": ids.index(i)} for i in queued]
    assert batches(db) == []


def test_an_expired_lease_on_a_batched_job_puts_it_back_as_a_row(db: psycopg.Connection) -> None:
    ids = enqueue_many(db, [{"kind": "k", "payload": {"n": i}} for i in range(3)])
    claimed = complete_and_claim(db, max_jobs=2)
    expire_lease(db, claimed[0]["id"])
    rescued = db.execute("select rescued from pgqueue.sweep()").fetchone()
    assert rescued == (2,)
    back = db.execute("select id, attempts, payload from pgqueue.jobs order by id").fetchall()
    assert back == [(ids[0], 1, {"n": 0}), (ids[1], 1, {"n": 1})]
    assert batches(db) == [(ids[0], "default", "k", 3, 2)]


def test_a_queue_with_keyed_jobs_takes_its_batches_beside_them(db: psycopg.Connection) -> None:
    db.execute("select pgqueue.set_concurrency_limit('tenant-b', 1)")
    keyed = enqueue_many(db, [{"kind": "k", "concurrency_key": "tenant-b"} for _ in range(3)])
    batch = enqueue_many(db, [{"kind": "k"} for _ in range(3)])
    claimed = complete_and_claim(db, max_jobs=10)
    ids = {j["id"] for j in claimed}
    assert ids >= set(batch) and len(ids & set(keyed)) == 1, "the limit holds; the batch is taken"
    assert batches(db) == []
    db.execute("select pgqueue.set_concurrency_limit('tenant-b', null)")


def test_the_sweeper_wakes_and_throughput_lists_a_queue_holding_only_batches(
    db: psycopg.Connection,
) -> None:
    enqueue_many(db, [{"kind": "k", "queue": "only-batches"} for _ in range(3)])
    assert rows(db) == 0
    assert db.execute("select woke from pgqueue.sweep()").fetchone() == (True,)
    queues = db.execute("select distinct queue from pgqueue.throughput(1)").fetchall()
    assert ("only-batches",) in queues
