"""What the queue tells about itself, on a real PostgreSQL: metrics() against direct counts of a
queue holding jobs in every state, throughput() per minute, the sweeper's rescue counters, and
trace context carried from enqueue to trace_contexts()."""

from __future__ import annotations

import re
import threading
from collections import defaultdict
from datetime import datetime, timedelta
from itertools import pairwise

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from testkit.plans import plans_logged
from testkit.project import REPO
from tests.sql.test_hot_path import complete_and_claim
from tests.sql.test_queue import AS_ROWS, enqueue_n, expire_lease

TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
OTHER_TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"

Sample = tuple[str, frozenset[tuple[str, str]]]


@pytest.fixture
def obs(db: psycopg.Connection) -> psycopg.Connection:
    """The db, with no queue state or workers before and after the test."""

    def clean() -> None:
        db.execute("truncate pgqueue.queues, pgqueue.workers, pgqueue.running_keys")

    clean()
    yield db
    clean()


def metrics(db: psycopg.Connection) -> dict[Sample, float]:
    rows = db.execute("select metric, labels, value from pgqueue.metrics()").fetchall()
    samples = {(metric, frozenset(labels.items())): value for metric, labels, value in rows}
    assert len(samples) == len(rows), "one row per metric and label set"
    assert [r[0] for r in rows] == sorted(r[0] for r in rows), "each metric's rows together"
    return samples


def of(samples: dict[Sample, float], metric: str) -> dict[tuple[str, ...], float]:
    """The samples of one metric, keyed by their label values in label-name order."""
    return {
        tuple(value for _, value in sorted(labels)): v
        for (name, labels), v in samples.items()
        if name == metric
    }


def counts(db: psycopg.Connection, sql: str) -> dict[tuple[str, ...], float]:
    """`sql` returns label values then a count: as a dict like of()'s."""
    return {tuple(row[:-1]): float(row[-1]) for row in db.execute(sql).fetchall()}


def claim_kind(db: psycopg.Connection, kind: str, n: int = 10, queue: str = "obs") -> list[dict]:
    return complete_and_claim(db, max_jobs=n, kinds=[kind], queue=queue)


def fill_every_state(db: psycopg.Connection) -> None:
    """Queue `obs` with jobs queued, scheduled later, running, running past their lease,
    retrying, done (batched and keyed), dead-lettered and cancelled, and waiting for a queued
    one; queue `held`, paused, with a queued job; finished jobs older than 5 minutes; and
    workers, one of them long gone."""
    first, *_ = enqueue_n(db, 3, "queued", queue="obs")
    db.execute(
        "select pgqueue.enqueue('waits', depends_on => array[%s]::bigint[], queue => 'obs')"
        " from generate_series(1, 2)",
        (first,),
    )
    db.execute(
        "select pgqueue.enqueue('later', run_after => now() + interval '1 hour', queue => 'obs')"
        " from generate_series(1, 2)"
    )
    enqueue_n(db, 2, "running", queue="obs")
    claim_kind(db, "running")
    enqueue_n(db, 1, "stuck", queue="obs")
    (stuck,) = claim_kind(db, "stuck")
    expire_lease(db, stuck["id"])
    enqueue_n(db, 2, "flaky", queue="obs")
    flaky = claim_kind(db, "flaky")
    db.execute(  # one due again now, one later
        "select pgqueue.fail(%s, %s, 'boom', retry_in => '0'), pgqueue.fail(%s, %s, 'boom')",
        (flaky[0]["id"], flaky[0]["lock_token"], flaky[1]["id"], flaky[1]["lock_token"]),
    )
    enqueue_n(db, 4, "batched", queue="obs")
    complete_and_claim(db, claim_kind(db, "batched"), max_jobs=0)
    db.execute("select pgqueue.enqueue('keyed', idempotency_key => 'k1', queue => 'obs')")
    complete_and_claim(db, claim_kind(db, "keyed"), max_jobs=0)
    enqueue_n(db, 2, "doomed", queue="obs", max_attempts=1)
    for doomed in claim_kind(db, "doomed"):
        db.execute("select pgqueue.fail(%s, %s, 'fatal')", (doomed["id"], doomed["lock_token"]))
    for job_id in enqueue_n(db, 1, "unwanted", queue="obs"):
        db.execute("select pgqueue.cancel(%s)", (job_id,))
    enqueue_n(db, 1, "held", queue="held")
    db.execute("select pgqueue.pause('held'), pgqueue.pause('empty')")
    # finished long ago: dead letters count, the last 5 minutes do not
    db.execute(
        "insert into pgqueue.job_history (id, queue, kind, status, priority, attempts,"
        " max_attempts, payload, created_at, finished_at)"
        " values (900001, 'obs', 'doomed', 'failed', 0, 1, 1, '{}', now() - interval '2 hours',"
        " now() - interval '1 hour'), (900002, 'obs', 'done', 'done', 0, 1, 1, null,"
        " now() - interval '2 hours', now() - interval '6 minutes');"
        "insert into pgqueue.done_batches (queue, kind, finished_at, ids, attempts, created_at,"
        " id_range) values ('obs', 'batched', now() - interval '1 hour', '{900003}', '{1}',"
        " array[now()], '[900003,900003]')"
    )
    db.execute(
        "select pgqueue.checkin('w1', 'obs', '{queued}'), pgqueue.checkin('w2', 'obs', '{}'),"
        " pgqueue.checkin('gone', 'obs', '{}'), pgqueue.checkin('w3', 'idle', '{}');"
        "update pgqueue.workers set seen_at = now() - interval '11 minutes' where worker = 'gone'"
    )


def test_every_metric_matches_a_direct_count(obs: psycopg.Connection) -> None:
    db = obs
    fill_every_state(db)
    samples = metrics(db)

    per_kind = "from pgqueue.live_jobs group by 1, 2 order by 1, 2"
    for metric, where in [
        ("pgqueue_jobs_queued", "status = 'queued'"),
        # runnable from the start of the second it falls due in (queued_counts' buckets)
        (
            "pgqueue_jobs_runnable",
            "status = 'queued' and date_bin('1 second', run_after, timestamptz 'epoch') <= now()",
        ),
        ("pgqueue_jobs_running", "status = 'running'"),
        ("pgqueue_jobs_retrying", "status = 'queued' and attempts > 0"),
        ("pgqueue_jobs_waiting", "status = 'waiting'"),
    ]:
        expected = counts(db, f"select kind, queue, count(*) filter (where {where}) {per_kind}")
        assert of(samples, metric) == expected, metric
    assert of(samples, "pgqueue_jobs_queued")[("queued", "obs")] == 3
    assert of(samples, "pgqueue_jobs_queued")[("later", "obs")] == 2
    assert of(samples, "pgqueue_jobs_runnable")[("later", "obs")] == 0
    assert of(samples, "pgqueue_jobs_running") == counts(
        db, f"select kind, queue, count(*) filter (where status = 'running') {per_kind}"
    )
    assert of(samples, "pgqueue_jobs_running")[("stuck", "obs")] == 1
    assert of(samples, "pgqueue_jobs_retrying")[("flaky", "obs")] == 2
    assert of(samples, "pgqueue_jobs_runnable")[("flaky", "obs")] == 1
    assert of(samples, "pgqueue_jobs_waiting")[("waits", "obs")] == 2
    assert of(samples, "pgqueue_jobs_queued")[("waits", "obs")] == 0

    # every queue with live jobs or a state, and nothing else
    queues = {("obs",), ("held",), ("empty",)}
    assert set(of(samples, "pgqueue_queue_paused")) == queues
    assert of(samples, "pgqueue_queue_paused") == counts(
        db,
        "select k.queue, (q.paused_at is not null)::int from (select queue from pgqueue.live_jobs"
        " union select queue from pgqueue.queues) as k left join pgqueue.queues as q using (queue)",
    )
    assert of(samples, "pgqueue_queue_paused") == {("obs",): 0, ("held",): 1, ("empty",): 1}
    assert of(samples, "pgqueue_expired_leases") == {("obs",): 1, ("held",): 0, ("empty",): 0}
    assert (
        of(samples, "pgqueue_expired_leases")[("obs",)]
        == counts(
            db,
            "select 'obs', count(*) from pgqueue.live_jobs"
            " where queue = 'obs' and status = 'running' and locked_until < now()",
        )[("obs",)]
    )

    ages = of(samples, "pgqueue_oldest_runnable_age_seconds")
    assert set(ages) == queues and ages[("empty",)] == 0
    (oldest_obs, oldest_held) = db.execute(
        "select extract(epoch from now() - min(run_after) filter (where queue = 'obs')),"
        " extract(epoch from now() - min(run_after) filter (where queue = 'held'))"
        " from pgqueue.live_jobs where status = 'queued' and run_after <= now()"
    ).fetchone()
    # measured by a later statement: the same age, grown a little; the gauge counts it from the
    # start of the second the job fell due in, so at most a second more
    assert ages[("obs",)] - 1 <= float(oldest_obs) < ages[("obs",)] + 5
    assert ages[("held",)] - 1 <= float(oldest_held) < ages[("held",)] + 5

    assert of(samples, "pgqueue_dead_letters") == counts(
        db,
        "select kind, queue, count(*) from pgqueue.job_history where status = 'failed'"
        " group by 1, 2",
    )
    assert of(samples, "pgqueue_dead_letters") == {("doomed", "obs"): 3}

    finished = counts(
        db,
        "select kind, queue, status, sum(n) from (select kind, queue, status, count(*) as n"
        " from pgqueue.job_history where finished_at > now() - interval '5 minutes'"
        " group by 1, 2, 3 union all select kind, queue, 'done', sum(cardinality(ids))"
        " from pgqueue.done_batches where finished_at > now() - interval '5 minutes'"
        " group by 1, 2) as f group by 1, 2, 3",
    )
    assert (
        of(samples, "pgqueue_jobs_finished_5m")
        == finished
        == {
            ("batched", "obs", "done"): 4,
            ("keyed", "obs", "done"): 1,
            ("doomed", "obs", "failed"): 2,
            ("unwanted", "obs", "cancelled"): 1,
        }
    )

    assert of(samples, "pgqueue_workers_alive") == {
        ("obs",): 2,
        ("idle",): 1,
        ("held",): 0,
        ("empty",): 0,
    }
    totals = counts(db, "select name, value from pgqueue.counters")
    assert of(samples, "pgqueue_lease_rescues_total") == {(): totals[("lease_rescues",)]}
    assert of(samples, "pgqueue_lease_dead_letters_total") == {(): totals[("lease_dead_letters",)]}

    documented = set(re.findall(r"`(pgqueue_\w+)`", (REPO / "docs/observability.md").read_text()))
    assert {name for name, _ in samples} <= documented
    assert {name for name, _ in samples} == {
        "pgqueue_jobs_queued",
        "pgqueue_jobs_runnable",
        "pgqueue_jobs_running",
        "pgqueue_jobs_retrying",
        "pgqueue_jobs_waiting",
        "pgqueue_oldest_runnable_age_seconds",
        "pgqueue_expired_leases",
        "pgqueue_dead_letters",
        "pgqueue_jobs_finished_5m",
        "pgqueue_queue_paused",
        "pgqueue_lease_rescues_total",
        "pgqueue_lease_dead_letters_total",
        "pgqueue_workers_alive",
    }


def test_an_empty_queue_reports_its_counters_only(obs: psycopg.Connection) -> None:
    names = {name for name, _ in metrics(obs)}
    assert names == {"pgqueue_lease_rescues_total", "pgqueue_lease_dead_letters_total"}


def test_the_sweeper_counts_exactly_the_leases_it_rescued(obs: psycopg.Connection) -> None:
    db = obs

    def totals() -> tuple[int, int]:
        found = counts(db, "select name, value from pgqueue.counters")
        return int(found[("lease_rescues",)]), int(found[("lease_dead_letters",)])

    enqueue_n(db, 3, "slow", queue="obs")
    enqueue_n(db, 2, "last", queue="obs", max_attempts=1)
    enqueue_n(db, 1, "fine", queue="obs")
    for claimed in claim_kind(db, "slow") + claim_kind(db, "last"):
        expire_lease(db, claimed["id"])
    claim_kind(db, "fine")  # a live lease: not rescued
    before = totals()
    with db.cursor(row_factory=dict_row) as cur:
        swept = cur.execute("select * from pgqueue.sweep()").fetchone()
    assert (swept["rescued"], swept["dead_lettered"]) == (3, 2)
    assert totals() == (before[0] + 3, before[1] + 2)
    samples = metrics(db)
    assert of(samples, "pgqueue_lease_rescues_total") == {(): before[0] + 3}
    assert of(samples, "pgqueue_lease_dead_letters_total") == {(): before[1] + 2}

    db.execute("select pgqueue.sweep()")
    assert totals() == (before[0] + 3, before[1] + 2), "a sweep that rescues nothing adds nothing"

    # pg_cron's command calls sweep() by name, and counts too (a kind of its own: the rescued
    # jobs wait runnable, in their places)
    (job_id,) = enqueue_n(db, 1, "again", queue="obs")
    claim_kind(db, "again")
    expire_lease(db, job_id)
    (command,) = db.execute(
        "select command from cron.job where jobname = 'pgqueue-sweep'"
    ).fetchone()
    assert command == "select pgqueue.sweep()"
    db.execute(command)
    assert totals() == (before[0] + 4, before[1] + 2)


def finished_at(db: psycopg.Connection, minutes_ago: int, seconds: int = 10) -> datetime:
    """A time `seconds` into the minute `minutes_ago` minutes before this one."""
    (moment,) = db.execute(
        "select date_trunc('minute', now()) - make_interval(mins => %s, secs => -%s)",
        (minutes_ago, seconds),
    ).fetchone()
    return moment


def history(db: psycopg.Connection, queue: str, status: str, at: datetime, n: int = 1) -> None:
    db.execute(
        "insert into pgqueue.job_history (id, queue, kind, status, priority, attempts,"
        " max_attempts, payload, created_at, finished_at)"
        " select 800000 + g + (random() * 1e6)::int, %s, 'k', %s, 0, 1, 1,"
        " case when %s <> 'done' then '{}'::jsonb end, %s, %s from generate_series(1, %s) as g",
        (queue, status, status, at, at, n),
    )


def test_throughput_counts_each_minute_of_each_queue_zeros_included(
    obs: psycopg.Connection,
) -> None:
    db = obs
    three_ago, one_ago = finished_at(db, 3), finished_at(db, 1, 40)
    history(db, "alpha", "done", three_ago, 2)
    history(db, "alpha", "failed", three_ago)
    history(db, "alpha", "cancelled", finished_at(db, 9))
    history(db, "alpha", "done", finished_at(db, 20))  # before the window
    history(db, "old", "done", finished_at(db, 40))  # a queue with nothing in the window
    db.execute(
        "insert into pgqueue.done_batches (queue, kind, finished_at, ids, attempts, created_at,"
        " id_range) values ('beta', 'k', %s, '{1,2,3,4,5}', '{1,1,1,1,1}',"
        " array[now(), now(), now(), now(), now()], '[1,5]')",
        (one_ago,),
    )
    enqueue_n(db, 1, queue="gamma")  # live jobs, nothing finished

    with db.cursor(row_factory=dict_row) as cur:
        rows = cur.execute("select * from pgqueue.throughput(15)").fetchall()
        (now_minute,) = cur.execute("select date_trunc('minute', now()) as m").fetchone().values()
    by_queue: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_queue[row["queue"]].append(row)
    assert set(by_queue) == {"alpha", "beta", "gamma"}
    for queue_rows in by_queue.values():
        minutes = [r["minute"] for r in queue_rows]
        assert len(minutes) == 15
        assert all(b - a == timedelta(minutes=1) for a, b in pairwise(minutes))
        assert minutes[-1] in (now_minute, now_minute - timedelta(minutes=1))
    assert [r["minute"] for r in rows] == sorted(r["minute"] for r in rows), "oldest first"
    busy = {
        (r["queue"], r["minute"]): (r["done"], r["failed"], r["cancelled"])
        for r in rows
        if r["done"] or r["failed"] or r["cancelled"]
    }

    def minute(at: datetime) -> datetime:
        return at.replace(second=0, microsecond=0)

    assert busy == {
        ("alpha", minute(three_ago)): (2, 1, 0),
        ("alpha", minute(finished_at(db, 9))): (0, 0, 1),
        ("beta", minute(one_ago)): (5, 0, 0),
    }

    (one,) = db.execute(
        "select count(*) from pgqueue.throughput(1) where queue = 'gamma'"
    ).fetchone()
    assert one == 1
    (default,) = db.execute("select count(distinct minute) from pgqueue.throughput()").fetchone()
    assert default == 30


@pytest.mark.parametrize("minutes", [0, -5, 1441, None])
def test_throughput_refuses_a_window_outside_a_day(
    obs: psycopg.Connection, minutes: int | None
) -> None:
    with pytest.raises(
        psycopg.errors.InvalidParameterValue, match="minutes must be between 1 and 1440"
    ):
        obs.execute("select * from pgqueue.throughput(%s)", (minutes,))


def test_metrics_and_throughput_read_finished_jobs_only_through_indexes(
    obs: psycopg.Connection,
) -> None:
    """A million finished jobs (a month of them, a hundred dead letters) in the history and a
    million more in done batches: no statement of metrics() or throughput() reads either table
    whole."""
    db = obs
    db.execute(
        "insert into pgqueue.job_history (id, queue, kind, status, priority, attempts,"
        " max_attempts, payload, idempotency_key, created_at, finished_at)"
        " select g, 'q' || g % 3, 'k' || g % 7, case when g % 10000 = 0 then 'failed' else"
        " 'done' end, 0, 1, 1, case when g % 10000 = 0 then '{}'::jsonb end, 'key' || g,"
        " now() - interval '30 days' + g * interval '2.592 seconds',"
        " now() - interval '30 days' + g * interval '2.592 seconds'"
        " from generate_series(1, 1000000) as g;"
        "insert into pgqueue.done_batches (queue, kind, finished_at, ids, attempts, created_at,"
        " id_range)"
        " select 'q' || b % 3, 'k', now() - interval '30 days' + b * interval '259.2 seconds',"
        " array(select b * 100 + i from generate_series(0, 99) as i), array_fill(1, array[100]),"
        " array_fill(now(), array[100]), int8range(b * 100, b * 100 + 99, '[]')"
        " from generate_series(1, 10000) as b;"
        "analyze pgqueue.job_history; analyze pgqueue.done_batches"
    )
    enqueue_n(db, 100, queue="q1")
    with plans_logged(db) as plans:
        samples = metrics(db)
        db.execute("select * from pgqueue.throughput(1440)")
    nested = "\n".join(plans)
    assert "Seq Scan on job_history" not in nested, nested
    assert "Seq Scan on done_batches" not in nested, nested
    # by finished_at: the BRIN indexes, or (since 1.4.0) the job list's btree indexes
    assert "job_history_finished_brin" in nested or "job_history_list_idx" in nested, nested
    assert "done_batches_finished_brin" in nested or "done_batches_list_idx" in nested, nested
    assert "job_history_kept_idx" in nested, "dead letters are counted through their index"
    assert sum(of(samples, "pgqueue_dead_letters").values()) == 100


# -- what the gauges cost, and their counts ----------------------------------------------------


def buffers(db: psycopg.Connection, sql: str) -> int:
    """Shared buffers (hit or read) that `sql` touches, the statements of the functions it calls
    included; its second run, so that nothing is planned or cached for the first time."""
    db.execute(sql).fetchall()
    ((plan,),) = db.execute(f"explain (analyze, buffers, format json) {sql}").fetchall()
    top = plan[0]["Plan"]
    return top["Shared Hit Blocks"] + top["Shared Read Blocks"]


def enqueue_backlog(db: psycopg.Connection, jobs: int) -> None:
    """`jobs` queued jobs, half of them in batches (enqueue_many() calls of 1,000) and half a row
    each, due over the last 10 hours (the rows one per second of 600 minutes, however many),
    one row in a hundred a retry."""
    half = jobs // 2
    db.execute(
        "select count(*) from generate_series(1, %(n)s, 1000) as f,"
        " lateral pgqueue.enqueue_many((select jsonb_agg(jsonb_build_object('kind', 'bulk'))"
        " from generate_series(f, least(f + 999, %(n)s)))) as e",
        {"n": half},
    )
    db.execute(
        "insert into pgqueue.jobs (queue, kind, run_after, attempts)"
        " select 'gauged', 'row' || g %% 3, now() - (g %% 600) * interval '1 minute',"
        " (g %% 100 = 0)::int"
        " from generate_series(1, %(n)s) as g",
        {"n": half},
    )


GAUGES = [
    "select * from pgqueue.metrics()",
    "select * from pgqueue.stats",
    "select * from pgqueue.queue_states",
    "select * from pgqueue.throughput(5)",
]


def test_the_gauges_read_as_much_with_200k_queued_jobs_as_with_1k(
    obs: psycopg.Connection,
) -> None:
    """The probe of issue 38: metrics() took 2 s with 1.3 million queued jobs, growing with the
    backlog. Now the gauges read the counts, whose rows depend on when jobs are due, not on how
    many there are: 200 times the jobs (in batches and in rows), at the same due times, cost
    them next to no more buffers."""
    db = obs
    enqueue_n(db, 1, "running", queue="gauged")
    claim_kind(db, "running", queue="gauged")
    enqueue_backlog(db, 1_000)
    db.execute("select pgqueue.sweep()")
    db.execute("vacuum analyze pgqueue.job_counts")
    small = {sql: buffers(db, sql) for sql in GAUGES}
    enqueue_backlog(db, 199_000)
    db.execute("select pgqueue.sweep()")
    db.execute("vacuum analyze pgqueue.job_counts")
    large = {sql: buffers(db, sql) for sql in GAUGES}
    for sql in GAUGES:
        assert large[sql] <= small[sql] * 1.5 + 10, (sql, small[sql], large[sql])
    queued = of(metrics(db), "pgqueue_jobs_queued")
    assert queued[("bulk", "default")] == 100_000
    assert sum(queued.values()) == 200_000
    running = of(metrics(db), "pgqueue_jobs_running")
    assert {labels: n for labels, n in running.items() if n} == {("running", "gauged"): 1}


def direct_and_counted(db: psycopg.Connection) -> tuple[list, list]:
    """Per queue and kind: queued jobs, runnable ones, retrying ones and the oldest runnable's
    due time, counted from the jobs themselves (live_jobs) and read from their counts
    (queued_counts), in one statement (one now()). A job counts as runnable from the start of
    the second it falls due in, and the oldest's time is the start of that second."""
    (direct, counted) = db.execute(
        "select (select coalesce(jsonb_agg(x order by x.queue, x.kind), '[]') from ("
        "  select queue, kind, count(*) as jobs, count(*) filter (where s <= now())"
        "   as runnable, count(*) filter (where attempts > 0) as retrying,"
        "   min(s) filter (where s <= now()) as oldest"
        "  from (select *, date_bin('1 second', run_after, timestamptz 'epoch') as s"
        "   from pgqueue.live_jobs where status = 'queued') as j"
        "  group by queue, kind) as x),"
        " (select coalesce(jsonb_agg(x order by x.queue, x.kind), '[]') from ("
        "  select queue, kind, sum(jobs) as jobs, coalesce(sum(jobs) filter (where due <= now()),"
        "   0) as runnable, sum(retrying) as retrying,"
        "   min(due) filter (where due <= now()) as oldest"
        "  from pgqueue.queued_counts group by 1, 2) as x)"
    ).fetchone()
    return direct, counted


def assert_counted_exactly(db: psycopg.Connection, step: str) -> None:
    direct, counted = direct_and_counted(db)
    # the oldest: exact to the second while it is within the last 10 minutes
    assert counted == direct, step


def test_the_counts_stay_exact_through_every_way_a_job_moves(obs: psycopg.Connection) -> None:
    db = obs
    assert_counted_exactly(db, "empty")
    enqueue_n(db, 2_500, "b", queue="c")  # three batches
    enqueue_n(db, 5, "r", queue="c", **AS_ROWS)
    db.execute("insert into pgqueue.jobs (queue, kind) values ('c', 'plain'), ('c', 'plain')")
    db.execute(
        "select pgqueue.enqueue('later', queue => 'c', run_after => now() + interval '1 hour'),"
        " pgqueue.enqueue('keyed', queue => 'c', idempotency_key => 'k')"
    )
    assert_counted_exactly(db, "enqueued")
    db.execute(
        "select pgqueue.enqueue('keyed', queue => 'c', idempotency_key => 'k',"
        " on_conflict => 'replace', run_after => now() + interval '5 minutes')"
    )
    assert_counted_exactly(db, "replaced: due later")
    db.execute(
        "select pgqueue.enqueue('keyed', queue => 'c', idempotency_key => 'k',"
        " on_conflict => 'debounce', run_after => now() + interval '10 minutes')"
    )
    assert_counted_exactly(db, "debounced")
    claimed = complete_and_claim(db, max_jobs=1_100, queue="c")
    assert_counted_exactly(db, "claimed from batches and rows")
    claimed += complete_and_claim(db, max_jobs=7, queue="c", kinds=["r", "plain"])
    assert_counted_exactly(db, "claimed rows")
    rows = [j for j in claimed if j["kind"] in ("r", "plain")]
    db.execute(
        "select pgqueue.fail(%s, %s, 'boom', retry_in => '0'), pgqueue.fail(%s, %s, 'boom')",
        (rows[0]["id"], rows[0]["lock_token"], rows[1]["id"], rows[1]["lock_token"]),
    )
    db.execute("select pgqueue.release(%s, %s)", (rows[2]["id"], rows[2]["lock_token"]))
    assert_counted_exactly(db, "failed, retried; released")
    complete_and_claim(db, claimed[:500], max_jobs=0)
    assert_counted_exactly(db, "completed")
    (dead,) = enqueue_n(db, 1, "dead", queue="c", max_attempts=1)
    (doomed,) = complete_and_claim(db, max_jobs=1, queue="c", kinds=["dead"])
    db.execute("select pgqueue.fail(%s, %s, 'fatal')", (dead, doomed["lock_token"]))
    db.execute("select pgqueue.retry(%s)", (dead,))
    assert_counted_exactly(db, "dead letter retried")
    (front, middle) = db.execute(
        "select first_id + taken, first_id + taken + 10 from pgqueue.job_batches"
        " where queue = 'c' order by first_id limit 1"
    ).fetchone()
    (row_job,) = db.execute(
        "select id from pgqueue.jobs where queue = 'c' and kind = 'plain' limit 1"
    ).fetchone() or (None,)
    for job_id in (front, middle, row_job, claimed[600]["id"]):
        if job_id is not None:
            db.execute("select pgqueue.cancel(%s)", (job_id,))
            assert_counted_exactly(db, f"cancelled {job_id}")
    lost = complete_and_claim(db, max_jobs=50, queue="c")
    for job in lost:
        expire_lease(db, job["id"])
    db.execute("select pgqueue.sweep()")
    assert_counted_exactly(db, "rescued by the sweeper, and folded")
    assert of(metrics(db), "pgqueue_jobs_retrying")[("b", "c")] == 50
    db.execute("truncate pgqueue.job_batches")
    assert_counted_exactly(db, "batches truncated")


def test_concurrent_claimers_enqueuers_and_sweeps_keep_the_counts_exact(
    obs: psycopg.Connection, stack
) -> None:
    """Four connections enqueue (batches and rows), claim, complete and fail at once while a
    fifth folds the counts; the counts end equal to the jobs, and at nothing once drained."""
    db = obs
    errors: list[BaseException] = []

    def work() -> None:
        try:
            with stack.connect(autocommit=True) as conn:
                for _ in range(15):
                    enqueue_n(conn, 40, "b", queue="conc")
                    enqueue_n(conn, 10, "r", queue="conc", **AS_ROWS)
                    jobs = complete_and_claim(conn, max_jobs=35, queue="conc")
                    for job in jobs[:3]:
                        conn.execute(
                            "select pgqueue.fail(%s, %s, 'boom', retry_in => '0')",
                            (job["id"], job["lock_token"]),
                        )
                    complete_and_claim(conn, jobs[3:], max_jobs=0)
        except BaseException as exc:
            errors.append(exc)

    def fold() -> None:
        try:
            with stack.connect(autocommit=True) as conn:
                while any(t.is_alive() for t in workers):
                    conn.execute("select pgqueue._fold_job_counts()")
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=work) for _ in range(4)]
    for t in workers:
        t.start()
    folder = threading.Thread(target=fold)
    folder.start()
    for t in [*workers, folder]:
        t.join()
    assert not errors, errors
    assert_counted_exactly(db, "after the concurrent run")
    direct, _ = direct_and_counted(db)
    assert direct and direct[0]["jobs"] > 0
    jobs = complete_and_claim(db, max_jobs=1_000, queue="conc")
    while jobs:
        jobs = complete_and_claim(db, jobs, max_jobs=1_000, queue="conc")
    db.execute("select pgqueue.sweep()")
    assert_counted_exactly(db, "drained")
    assert db.execute("select count(*) from pgqueue.job_counts").fetchone() == (0,)


# -- trace context --------------------------------------------------------------------------


def trace_contexts(db: psycopg.Connection, ids: list[int]) -> dict[int, str]:
    return dict(db.execute("select * from pgqueue.trace_contexts(%s)", (ids,)).fetchall())


def test_a_traceparent_given_at_enqueue_is_read_back_for_the_claimed_jobs(
    obs: psycopg.Connection,
) -> None:
    db = obs
    (traced,) = db.execute("select pgqueue.enqueue('t', traceparent => %s)", (TRACE,)).fetchone()
    (plain,) = db.execute("select pgqueue.enqueue('t')").fetchone()
    claimed = claim_kind(db, "t", queue="default")
    assert {j["id"] for j in claimed} == {traced, plain}
    assert trace_contexts(db, [traced, plain, 424242]) == {traced: TRACE}
    assert trace_contexts(db, []) == {}


BAD_TRACEPARENTS = [
    "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",  # uppercase
    "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff
    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # zero trace-id
    "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # zero parent-id
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  # no flags
    "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",  # short trace-id
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
    "",
    "not a traceparent",
]


@pytest.mark.parametrize("bad", BAD_TRACEPARENTS)
def test_a_malformed_traceparent_is_refused_and_nothing_is_enqueued(
    obs: psycopg.Connection, bad: str
) -> None:
    db = obs
    expected = "traceparent must be a W3C trace context header, 00-<32 hex trace-id>"
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=expected):
        db.execute("select pgqueue.enqueue('t', traceparent => %s)", (bad,))
    jobs = Jsonb([{"kind": "t"}, {"kind": "t", "traceparent": bad}])
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=expected):
        db.execute("select pgqueue.enqueue_many(%s)", (jobs,))
    keyed = Jsonb([{"kind": "t", "idempotency_key": "a"}, {"kind": "t", "traceparent": bad}])
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=expected):
        db.execute("select pgqueue.enqueue_many(%s)", (keyed,))
    assert db.execute("select count(*) from pgqueue.jobs").fetchone() == (0,)


def near_traceparents() -> list[str]:
    """TRACE with one character replaced, removed or added at each position, each replacement
    drawn from characters a bad header might hold: what a format test can get wrong."""
    swaps = ["-", "0", "f", "g", "A", "_", " ", "\n", "é"]
    out = [TRACE, TRACE + "\n", "\n" + TRACE, TRACE.replace("-", "")]
    for i in range(len(TRACE) + 1):
        out.append(TRACE[:i] + TRACE[i + 1 :])
        out += [TRACE[:i] + c + TRACE[i + 1 :] for c in swaps]
        out += [TRACE[:i] + c + TRACE[i:] for c in ("0", "-")]
    return sorted(set(out))


def is_traceparent(value: str) -> bool:
    """The W3C traceparent header as this version of the spec writes it: version, trace-id,
    parent-id and flags in lowercase hex, a version other than ff, ids not all zeros."""
    return (
        re.fullmatch(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}", value) is not None
        and not value.startswith("ff")
        and value[3:35] != "0" * 32
        and value[36:52] != "0" * 16
    )


def test_the_domain_and_enqueue_many_accept_exactly_what_the_spec_accepts(
    obs: psycopg.Connection,
) -> None:
    """The trace_context domain's check and enqueue_many() test the format with an inlined
    expression (pgqueue._is_traceparent(): no function call per job); the spec's regular
    expression is the definition they must agree with."""
    db = obs
    values = near_traceparents()
    assert len(values) > 500
    verdicts = {value: is_traceparent(value) for value in values}
    assert sum(verdicts.values()) > 50, "the near misses include valid headers"
    for value in values:
        with db.transaction(force_rollback=True):
            try:
                with db.transaction():
                    db.execute(
                        "insert into pgqueue.jobs (kind, trace_context) values ('t', %s)", (value,)
                    )
                stored = True
            except psycopg.errors.CheckViolation:
                stored = False
            try:
                with db.transaction():
                    db.execute(
                        "select pgqueue.enqueue_many(%s)",
                        (Jsonb([{"kind": "t", "traceparent": value}]),),
                    )
                enqueued = True
            except psycopg.errors.InvalidParameterValue:
                enqueued = False
        assert stored == enqueued == verdicts[value], repr(value)


def test_a_valid_traceparent_costs_no_function_call_per_job(obs: psycopg.Connection) -> None:
    db = obs
    jobs = Jsonb([{"kind": "t", "traceparent": TRACE}] * 50)
    with db.transaction(force_rollback=True):
        db.execute("set local track_functions = 'all'")
        db.execute("select pgqueue.enqueue_many(%s)", (jobs,))
        calls = db.execute(
            "select coalesce(sum(calls), 0) from pg_stat_xact_user_functions where"
            " schemaname = 'pgqueue' and funcname in ('_is_traceparent', '_checked_traceparent')"
        ).fetchone()
        stored = db.execute(
            "select count(*) from pgqueue.jobs where trace_context = %s", (TRACE,)
        ).fetchone()
    assert stored == (50,)
    assert calls == (0,)


def test_the_table_refuses_a_malformed_trace_context_written_directly(
    obs: psycopg.Connection,
) -> None:
    (job_id,) = enqueue_n(obs, 1, **AS_ROWS)
    with pytest.raises(psycopg.errors.CheckViolation, match="traceparent_format"):
        obs.execute("update pgqueue.jobs set trace_context = 'x' where id = %s", (job_id,))


def test_enqueue_many_keeps_each_elements_traceparent(obs: psycopg.Connection) -> None:
    db = obs
    plain = enqueue_n(db, 1) + enqueue_n(db, 1, traceparent=TRACE) + enqueue_n(db, 1)
    assert trace_contexts(db, plain) == {plain[1]: TRACE}
    db.execute(
        "select pgqueue.enqueue('t', idempotency_key => 'taken', traceparent => %s)", (TRACE,)
    )
    keyed = [
        r[0]
        for r in db.execute(
            "select pgqueue.enqueue_many(%s)",
            (
                Jsonb(
                    [
                        {"kind": "t", "idempotency_key": "new", "traceparent": OTHER_TRACE},
                        {"kind": "t", "idempotency_key": "taken", "traceparent": OTHER_TRACE},
                        {"kind": "t"},
                    ]
                ),
            ),
        )
    ]
    assert trace_contexts(db, keyed) == {keyed[0]: OTHER_TRACE, keyed[1]: TRACE}, (
        "a taken key keeps its job, and its job's trace"
    )


def test_replacing_a_waiting_job_takes_the_new_traceparent(obs: psycopg.Connection) -> None:
    db = obs
    enqueue = (
        "select pgqueue.enqueue('t', idempotency_key => 'k', on_conflict => %s, traceparent => %s)"
    )
    (job_id,) = db.execute(enqueue, ("keep", TRACE)).fetchone()
    assert db.execute(enqueue, ("keep", OTHER_TRACE)).fetchone() == (job_id,)
    assert trace_contexts(db, [job_id]) == {job_id: TRACE}
    db.execute(enqueue, ("replace", OTHER_TRACE))
    assert trace_contexts(db, [job_id]) == {job_id: OTHER_TRACE}
    db.execute(enqueue, ("debounce", None))
    assert trace_contexts(db, [job_id]) == {job_id: OTHER_TRACE}, (
        "none given: the job keeps its own"
    )


def test_a_worker_that_checks_out_is_no_longer_alive(db: psycopg.Connection) -> None:
    """checkout() (1.1.0): a worker that stops cleanly leaves pgqueue_workers_alive at once, so
    a restarted worker counts once, not once per run for 10 minutes."""

    def alive() -> int:
        row = db.execute(
            "select value from pgqueue.metrics() where metric = 'pgqueue_workers_alive'"
            " and labels ->> 'queue' = 'checkout-test'"
        ).fetchone()
        return int(row[0]) if row else 0

    db.execute("delete from pgqueue.workers where queue = 'checkout-test'")
    for run in ("worker-run-1", "worker-run-2"):
        db.execute("select pgqueue.checkin(%s, 'checkout-test', array['noop'])", (run,))
    assert alive() == 2
    assert db.execute("select pgqueue.checkout('worker-run-1')").fetchone() == (True,)
    assert db.execute("select pgqueue.checkout('worker-run-1')").fetchone() == (False,)
    assert alive() == 1
    db.execute("select pgqueue.checkout('worker-run-2')")
