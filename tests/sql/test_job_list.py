"""The job list (list_jobs(), count_jobs()) and what acts on the set it finds (retry_jobs(),
cancel_jobs()): every status wherever its jobs are kept (rows and batches of queued jobs,
claims, the history and done_batches), each filter, pages that neither skip nor repeat a job
while other jobs move, capped counts, bulk actions that touch only the filtered set and at
most their share, and an index for each filter."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from testkit.plans import plans_logged

STATUSES = ("queued", "running", "done", "failed", "cancelled")
FINISHED = ("done", "failed", "cancelled")
FILTERS = ("kind", "queue", "idempotency_key", "since", "until")


def claim(db: psycopg.Connection, n: int, queue: str = "default") -> list[tuple[int, str]]:
    return db.execute(
        "select id, lock_token from pgqueue.claim('w', %s, queue => %s)", (n, queue)
    ).fetchall()


@pytest.fixture
def kept(db: psycopg.Connection) -> psycopg.Connection:
    """Jobs in every status and every place: queued as rows (some with a key) and in batches,
    running, done in done_batches (several batches finishing at one time) and in the history
    (a result or a key), dead letters and cancelled jobs, of kinds a, b, c in queues default
    and mail, created and finished at times spread over hours, with ties."""
    db.execute(
        "select pgqueue.enqueue_many(%s)",
        (Jsonb([{"kind": "a", "payload": {"n": n}} for n in range(30)]),),
    )
    db.execute(
        "select pgqueue.enqueue_many(%s)",
        (Jsonb([{"kind": "b", "queue": "mail", "payload": {"n": n}} for n in range(20)]),),
    )
    for n in range(40):
        db.execute(
            "select pgqueue.enqueue(%s, %s, queue => %s, idempotency_key => %s)",
            (
                "abc"[n % 3],
                Jsonb({"n": n}),
                "mail" if n % 4 == 0 else "default",
                f"key-{n}" if n % 5 == 0 else None,
            ),
        )
    taken = claim(db, 45) + claim(db, 8, "mail")
    done, results, dead, cancelled = taken[:20], taken[20:28], taken[28:40], taken[40:46]
    db.execute("select pgqueue.complete_many(%s, %s)", ([i for i, _ in done], [t for _, t in done]))
    for job_id, token in results:
        db.execute("select pgqueue.complete(%s, %s, '{\"ok\": true}')", (job_id, token))
    for job_id, token in dead:
        db.execute("select pgqueue.fail(%s, %s, 'boom', retryable => false)", (job_id, token))
    for job_id, _ in cancelled:
        db.execute("select pgqueue.cancel(%s)", (job_id,))
    # queued jobs cancelled too: a row and batch elements (one splits its batch)
    for (job_id,) in db.execute(
        "(select id from pgqueue.jobs order by id limit 2)"
        " union all (select first_id + size - 1 from pgqueue.job_batches limit 1)"
        " union all (select first_id + taken + 2 from pgqueue.job_batches limit 1)"
    ).fetchall():
        db.execute("select pgqueue.cancel(%s)", (job_id,))
    # times spread over hours, with ties inside and across the history and done_batches
    db.execute(
        "update pgqueue.job_history set finished_at = date_trunc('second', now())"
        "  - (id / 1024 % 7) * interval '10 minutes';"
        "update pgqueue.done_batches set finished_at = date_trunc('second', now())"
        "  - (lower(id_range) / 1024 % 3) * interval '10 minutes';"
        "update pgqueue.jobs set created_at = now() - (id / 1024 % 5) * interval '1 hour';"
        "update pgqueue.job_batches set created_at = now() - interval '150 minutes'"
        "  where queue = 'mail'"
    )
    return db


def reference(db: psycopg.Connection, status: str | None, **filters: Any) -> list[int]:
    """The ids list_jobs() should give, from all_jobs, in the status's order."""
    with db.cursor(row_factory=dict_row) as cur:
        rows = cur.execute("select * from pgqueue.all_jobs").fetchall()

    def passes(row: dict) -> bool:
        at = row["finished_at"] if row["status"] in FINISHED else row["created_at"]
        return (
            status in (None, row["status"])
            and all(filters.get(k) in (None, row[k]) for k in ("kind", "queue", "idempotency_key"))
            and (filters.get("since") is None or at >= filters["since"])
            and (filters.get("until") is None or at < filters["until"])
        )

    found = [r for r in rows if passes(r)]
    if status in FINISHED:
        found.sort(key=lambda r: (r["finished_at"], r["id"]), reverse=True)
    else:
        found.sort(key=lambda r: r["id"], reverse=True)
    return [r["id"] for r in found]


LIST = (
    "select id, status, finished_at from pgqueue.list_jobs(status => %(status)s,"
    " kind => %(kind)s, queue => %(queue)s, idempotency_key => %(idempotency_key)s,"
    " since => %(since)s, until => %(until)s, before_id => %(before_id)s,"
    " before_finished_at => %(before_finished_at)s, page_size => %(page_size)s)"
)


def page(
    db: psycopg.Connection,
    status: str | None,
    after: tuple | None = None,
    size: int = 4,
    **filters: Any,
) -> list[tuple[int, str, datetime | None]]:
    """One page of list_jobs(), after the row `after` (id, status, finished_at)."""
    args = dict.fromkeys(FILTERS) | filters
    args |= {
        "status": status,
        "before_id": after[0] if after else None,
        "before_finished_at": after[2] if after and status in FINISHED else None,
        "page_size": size,
    }
    return db.execute(LIST, args).fetchall()


def every_page(
    db: psycopg.Connection, status: str | None, size: int = 4, **filters: Any
) -> list[int]:
    ids: list[int] = []
    after = None
    while rows := page(db, status, after, size, **filters):
        assert len(rows) <= size
        ids += [r[0] for r in rows]
        after = rows[-1]
    return ids


def count(db: psycopg.Connection, status: str | None, cap: int = 10000, **filters: Any) -> int:
    args = dict.fromkeys(FILTERS) | filters | {"status": status, "cap": cap}
    return db.execute(
        "select pgqueue.count_jobs(status => %(status)s, kind => %(kind)s, queue => %(queue)s,"
        " idempotency_key => %(idempotency_key)s, since => %(since)s, until => %(until)s,"
        " cap => %(cap)s)",
        args,
    ).fetchone()[0]


def test_each_status_and_filter_pages_through_exactly_its_jobs(kept: psycopg.Connection) -> None:
    now = kept.execute("select now()").fetchone()[0]
    hour_ago = now - timedelta(minutes=45)
    cases: list[dict[str, Any]] = [{}]
    cases += [{"kind": k} for k in "abc"] + [{"queue": q} for q in ("default", "mail")]
    cases += [{"since": hour_ago}, {"until": hour_ago}, {"kind": "b", "queue": "mail"}]
    cases += [{"since": now - timedelta(hours=3), "until": hour_ago, "kind": "a"}]
    seen_somewhere = set()
    for status in STATUSES:
        for filters in cases:
            expected = reference(kept, status, **filters)
            assert every_page(kept, status, **filters) == expected, (status, filters)
            assert count(kept, status, **filters) == len(expected), (status, filters)
            seen_somewhere.update(expected)
        assert reference(kept, status), f"the fixture has no {status} job"
    everything = {i for (i,) in kept.execute("select id from pgqueue.all_jobs")}
    assert seen_somewhere == everything
    # one page of done jobs crosses done_batches and the history, ties included
    done = reference(kept, "done")
    assert every_page(kept, "done", size=1) == every_page(kept, "done", size=1000) == done


def test_a_key_finds_its_jobs_whatever_their_status(kept: psycopg.Connection) -> None:
    for n in range(0, 40, 5):
        key = f"key-{n}"
        expected = reference(kept, None, idempotency_key=key)
        assert len(expected) == 1
        assert every_page(kept, None, idempotency_key=key) == expected
        assert count(kept, None, idempotency_key=key) == 1
    statuses = {r[1] for n in range(0, 40, 5) for r in page(kept, None, idempotency_key=f"key-{n}")}
    assert "queued" in statuses and len(statuses) > 1


def test_counts_stop_at_their_cap(kept: psycopg.Connection) -> None:
    queued = len(reference(kept, "queued"))
    assert queued > 10
    assert count(kept, "queued", cap=10) == 11
    assert count(kept, "queued", cap=queued) == queued
    assert count(kept, "done", cap=3) == 4
    assert count(kept, "failed", cap=100) == len(reference(kept, "failed"))


def test_pages_neither_skip_nor_repeat_a_job_while_others_move(kept: psycopg.Connection) -> None:
    """Between pages, workers claim, complete and fail jobs and new ones arrive: each job that
    stays in the status it is listed by is listed once, and no job twice."""
    for status in ("queued", "done", "failed"):
        before = set(reference(kept, status))
        listed: list[int] = []
        after = None
        while rows := page(kept, status, after, size=3):
            listed += [r[0] for r in rows]
            after = rows[-1]
            # the others move: new jobs, jobs claimed and finished every which way
            kept.execute("select pgqueue.enqueue('a', '{}')")
            taken = claim(kept, 2)
            if taken:
                kept.execute("select pgqueue.complete(%s, %s)", taken[0])
            if len(taken) > 1:
                kept.execute("select pgqueue.fail(%s, %s, 'x', retryable => false)", taken[1])
        stayed = before & set(reference(kept, status))
        assert len(listed) == len(set(listed)), status
        assert stayed <= set(listed), status


def bulk(
    db: psycopg.Connection, action: str, status: str | None, max_jobs: int = 1000, **filters: Any
) -> int:
    args = dict.fromkeys(FILTERS) | filters | {"status": status, "max_jobs": max_jobs}
    return db.execute(
        f"select pgqueue.{action}(status => %(status)s, kind => %(kind)s, queue => %(queue)s,"
        " idempotency_key => %(idempotency_key)s, since => %(since)s, until => %(until)s,"
        " max_jobs => %(max_jobs)s)",
        args,
    ).fetchone()[0]


def statuses(db: psycopg.Connection) -> dict[int, str]:
    return dict(db.execute("select id, status from pgqueue.all_jobs").fetchall())


def test_retry_jobs_brings_back_only_the_filtered_set_a_share_a_call(
    kept: psycopg.Connection,
) -> None:
    before = statuses(kept)
    target = reference(kept, "failed", kind="a") + reference(kept, "cancelled", kind="a")
    assert len(target) > 2
    assert bulk(kept, "retry_jobs", None, max_jobs=2, kind="a") == 2
    assert bulk(kept, "retry_jobs", None, kind="a") == len(target) - 2
    assert bulk(kept, "retry_jobs", None, kind="a") == 0
    after = statuses(kept)
    assert {i for i in before if before[i] != after[i]} == set(target)
    assert all(after[i] == "queued" for i in target)
    assert kept.execute(
        "select bool_and(attempts = 0) from pgqueue.jobs where id = any(%s)", (target,)
    ).fetchone()[0]
    # `until`: jobs that finished after it stay
    (until,) = kept.execute(
        "select min(finished_at) from pgqueue.job_history where status = 'failed'"
    ).fetchone()
    assert bulk(kept, "retry_jobs", "failed", until=until) == 0
    assert bulk(kept, "retry_jobs", "failed", until=until + timedelta(seconds=1)) > 0


def test_cancel_jobs_cancels_only_the_filtered_queued_set_a_share_a_call(
    kept: psycopg.Connection,
) -> None:
    before = statuses(kept)
    target = reference(kept, "queued", queue="mail")
    assert len(target) > 5
    assert kept.execute("select count(*) from pgqueue.job_batches where queue = 'mail'").fetchone()[
        0
    ], "some of the set is in a batch"
    running = [i for i, s in before.items() if s == "running"]
    assert bulk(kept, "cancel_jobs", "queued", max_jobs=5, queue="mail") == 5
    assert bulk(kept, "cancel_jobs", None, queue="mail") == len(target) - 5
    after = statuses(kept)
    assert {i for i in before if before[i] != after[i]} == set(target)
    assert all(after[i] == "cancelled" for i in target)
    assert all(after[i] == "running" for i in running)
    assert count(kept, "queued", queue="mail") == 0
    # a cancelled job keeps its payload, for a retry
    job = kept.execute("select payload from pgqueue.job(%s)", (target[-1],)).fetchone()[0]
    assert "n" in job


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ("list_jobs()", "list_jobs(): which status?"),
        ("list_jobs('dead')", "list_jobs(): no status 'dead'"),
        (
            "list_jobs('done', page_size => 0)",
            "list_jobs(): page_size must be between 1 and 1000",
        ),
        (
            "list_jobs('done', before_id => 5)",
            "list_jobs(): a page after a finished job needs both",
        ),
        ("count_jobs('queued', cap => 0)", "count_jobs(): cap must be between 1 and 100000, got 0"),
        ("retry_jobs('done')", "retry_jobs() brings back dead letters (failed) and cancelled"),
        ("retry_jobs(max_jobs => 5000)", "retry_jobs(): max_jobs must be between 1 and 1000"),
        ("cancel_jobs('running')", "cancel_jobs() cancels queued or waiting jobs, not running"),
    ],
)
def test_a_filter_that_cannot_be_served_is_refused_by_name(
    db: psycopg.Connection, call: str, message: str
) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
        db.execute(f"select * from pgqueue.{call}")
    assert str(refused.value).startswith(message)


@pytest.mark.parametrize(
    ("status", "filters", "index"),
    [
        ("failed", {}, "job_history_list_idx"),
        ("failed", {"kind": "a"}, "job_history_kind_list_idx"),
        ("cancelled", {"queue": "mail"}, "job_history_queue_list_idx"),
        ("done", {}, "done_batches_list_idx"),
        ("done", {"kind": "a"}, "done_batches_kind_list_idx"),
        ("done", {"queue": "mail"}, "done_batches_queue_list_idx"),
        (None, {"idempotency_key": "key-5"}, "job_history_idempotency_key_idx"),
    ],
)
def test_each_filter_reads_its_index(
    kept: psycopg.Connection, status: str | None, filters: dict, index: str
) -> None:
    """Each filter's page and count can read their index (the planner here has too few rows to
    prefer it on its own: sequential scans are turned off; bench/job_list.py shows the plans
    with a million jobs)."""
    kept.execute("analyze pgqueue.job_history, pgqueue.done_batches")
    kept.execute("set enable_seqscan = off")
    try:
        with plans_logged(kept) as plans:
            page(kept, status, **filters)
            count(kept, status, **filters)
    finally:
        kept.execute("reset enable_seqscan")
    scans = "\n".join(plans)
    assert scans.count(f"using {index}") >= 2, scans
