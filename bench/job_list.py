"""The dashboard's job list with a million finished jobs: `bench/run --only job_list`.

Fills `finished` finished jobs stored as the queue stores them (done jobs in done_batches, a
row per completing call of up to 100 jobs of a queue and kind; dead letters, cancelled jobs and
done jobs with an idempotency key or a result in job_history), finished over the last week
in id order with some jitter, of kinds and queues from common to rare; and `queued` queued
jobs, half as rows of `jobs` (one in ten with an idempotency key), half in enqueue_many()
batches. Then, for each filter the list offers, times list_jobs()'s first page, a deep page (a
cursor half-way through the week, or through the queued ids) and count_jobs() (capped at
10,000): the median of CALLS calls each, in ms. Issue 50's target: each at most 100 ms.

It also prints, per filter, the indexes the page's and the count's plans read (auto_explain of
the statements the functions run), so a run on a busy machine still says whether each filter
is an index scan.
"""

from __future__ import annotations

import itertools
import re
import statistics
import sys
import time
from datetime import datetime, timedelta
from typing import Any

import psycopg

from testkit.plans import plans_logged

from .queue_sql import reset, state_tables
from .stack import SCHEMA, Stack, wait_idle_autovacuum

S = SCHEMA
CALLS = 5
# kinds from common to rare (their share of the jobs), and queues likewise
KINDS = {"send_email": 0.6, "resize_image": 0.25, "render_report": 0.149, "rare_kind": 0.001}
QUEUES = {"default": 0.8, "mail": 0.19, "rare_queue": 0.01}

# name: (status, filters) of each figure; since/until are set from the fill's times
CASES: dict[str, tuple[str | None, dict[str, Any]]] = {
    "queued": ("queued", {}),
    "queued_kind": ("queued", {"kind": "render_report"}),
    "queued_queue": ("queued", {"queue": "rare_queue"}),
    "queued_rare_kind": ("queued", {"kind": "rare_kind"}),
    "running": ("running", {}),
    "done": ("done", {}),
    "done_kind": ("done", {"kind": "render_report"}),
    "done_rare_kind": ("done", {"kind": "rare_kind"}),
    "done_queue": ("done", {"queue": "rare_queue"}),
    "done_hour": ("done", {"window": True}),
    "failed": ("failed", {}),
    "failed_kind": ("failed", {"kind": "resize_image"}),
    "failed_queue": ("failed", {"queue": "mail"}),
    "failed_hour": ("failed", {"window": True}),
    "cancelled": ("cancelled", {}),
    "failed_kind_queue": ("failed", {"kind": "send_email", "queue": "mail"}),
    "key": (None, {"idempotency_key": "set from the fill"}),
}


def _pick(shares: dict[str, float], column: str) -> str:
    """SQL picking a name by its share from `column` (a random number in [0, 1))."""
    bounds, total = [], 0.0
    for name, share in shares.items():
        total += share
        bounds.append(f"when {column} < {total} then '{name}'")
    return f"case {' '.join(bounds)} else '{next(reversed(shares))}' end"


def _each_last(shares: dict[str, float], n: str, rows: int) -> str:
    """SQL for a random number in [0, 1) that _pick() reads as each name in turn for the last
    rows (`n` from 1 to `rows`; the last, since a claim takes the first), so that every name has
    a queued row however few there are (a smoke run's 2,000 queued rows hold two of a 0.1% kind
    on average: none, one run in seven)."""
    bounds = [0.0]
    for share in shares.values():
        bounds.append(bounds[-1] + share)
    middles = ", ".join(f"{(low + high) / 2}" for low, high in itertools.pairwise(bounds))
    first = rows - len(shares)
    return f"case when {n} > {first} then (array[{middles}])[{n} - {first}] else random() end"


def fill(conn: psycopg.Connection, finished: int, queued: int) -> None:
    """The finished and queued jobs (see the module's docstring), as the queue stores them."""
    week = 7 * 86400
    conn.execute(
        f"""
        create temp table f as
        select n as id, {_pick(KINDS, "r1")} as kind, {_pick(QUEUES, "r2")} as queue,
               case when r3 < 0.85 then 'done' when r3 < 0.95 then 'failed' else 'cancelled' end
                 as status,
               r4 < 0.1 as kept,
               now() - make_interval(secs => {week} * (1 - n::float8 / %(n)s) + r4 * 30)
                 as finished_at
        from (select n, random() r1, random() r2, random() r3, random() r4
              from generate_series(1, %(n)s) as n) as x
        """,
        {"n": finished},
    )
    # done jobs without a key or result: a done_batches row per 100 of a queue and kind
    conn.execute(
        f"""
        insert into {S}.done_batches (queue, kind, finished_at, ids, attempts, created_at, id_range)
        select queue, kind, max(finished_at), array_agg(id order by id),
               array_agg(1), array_agg(finished_at - interval '2 seconds' order by id),
               int8range(min(id), max(id), '[]')
        from (select f.*, row_number() over (partition by queue, kind order by id) / 100 as b
              from f where status = 'done' and not kept) as d
        group by queue, kind, b
        """
    )
    conn.execute(
        f"""
        insert into {S}.job_history (id, queue, kind, status, priority, attempts, max_attempts,
          payload, idempotency_key, last_error, created_at, finished_at, result)
        select id, queue, kind, status, 0, case when status = 'done' then 1 else 5 end, 5,
               case when status = 'done' then null else jsonb_build_object('n', id) end,
               case when status = 'done' and id % 2 = 0 then 'key-' || id end,
               case when status = 'failed' then 'HTTP 503 from upstream' end,
               finished_at - interval '1 minute', finished_at,
               case when status = 'done' and id % 2 = 1 then '{{"ok": true}}'::jsonb end
        from f where status <> 'done' or kept
        order by finished_at
        """
    )
    conn.execute("drop table f")
    conn.execute(f"select setval(pg_get_serial_sequence('{S}.jobs', 'id'), %s)", (finished + 1,))
    conn.execute(
        f"""
        insert into {S}.jobs (kind, queue, payload, idempotency_key)
        select {_pick(KINDS, "r1")}, {_pick(QUEUES, "r2")}, jsonb_build_object('n', n),
               case when n %% 10 = 0 then 'queued-key-' || n end
        from (select n, {_each_last(KINDS, "n", queued // 2)} r1, random() r2
              from generate_series(1, %s) as n) as x
        """,
        (queued // 2,),
    )
    # enqueue_many() calls of 1,000 jobs of one kind and queue each, stored as batches
    conn.execute(
        f"select count(*) from generate_series(0, %s) as c, lateral {S}.enqueue_many(("
        "  select jsonb_agg(jsonb_build_object("
        "    'kind', case when c %% 2 = 0 then 'send_email' else 'render_report' end,"
        "    'queue', case when c %% 2 = 0 then 'default' else 'rare_queue' end,"
        "    'payload', jsonb_build_object('n', i)))"
        "  from generate_series(1, 1000) as i)) as e",
        (queued // 2000 - 1,),
    )
    conn.execute(f"select count(*) from {S}.claim('bench', 100)")


def _arguments(filters: dict[str, Any], window: tuple[datetime, datetime]) -> dict[str, Any]:
    found = {k: v for k, v in filters.items() if k != "window"}
    if filters.get("window"):
        found["since"], found["until"] = window
    return found


def _call(conn: psycopg.Connection, sql: str, args: dict[str, Any]) -> float:
    began = time.perf_counter()
    conn.execute(sql, args).fetchall()
    return (time.perf_counter() - began) * 1000


def _indexes(conn: psycopg.Connection, sql: str, args: dict[str, Any]) -> list[str]:
    """The tables and indexes the plans of the statements `sql` runs read (auto_explain)."""
    with plans_logged(conn) as plans:
        conn.execute(sql, args).fetchall()
    text = "\n".join(plans)
    scans = re.findall(r"((?:Index Only|Index|Bitmap Index|Seq) Scan(?: Backward)? \w+ \w+)", text)
    return sorted(set(scans))


def _check_and_build(conn: psycopg.Connection, finished: int, queued: int) -> dict[str, float]:
    """Checks that the fill holds what it should, and times what 1.4.0's step spends building
    the list's indexes on job_history (each built again from scratch), in seconds."""
    kept, in_batches, live = conn.execute(
        f"select (select count(*) from {S}.job_history),"
        f" (select sum(cardinality(ids)) from {S}.done_batches),"
        f" (select count(*) from {S}.live_jobs)"
    ).fetchone()
    if kept + in_batches != finished or live != queued:
        raise RuntimeError(f"job_list: filled {kept} + {in_batches} finished, {live} live")
    began = time.perf_counter()
    for index in (
        "job_history_list_idx",
        "job_history_kind_list_idx",
        "job_history_queue_list_idx",
    ):
        conn.execute(f"reindex index {S}.{index}")
    built = time.perf_counter() - began
    stored = f"{kept:,} rows of job_history, {in_batches:,} done jobs in batches"
    print(f"bench: job_list: {stored}; its 3 list indexes built in {built:.1f}s", file=sys.stderr)
    return {"history_rows": float(kept), "history_list_indexes_build_s": built}


def measure(stack: Stack, finished: int, queued: int) -> dict[str, float]:
    """Fill, then each case's first page, deep page and count (ms, medians of CALLS)."""
    reset(stack)
    with stack.cluster.connect(autocommit=True) as conn:
        began = time.monotonic()
        fill(conn, finished, queued)
        conn.execute(f"vacuum analyze {', '.join(state_tables(conn))}")
        print(f"bench: job_list filled in {time.monotonic() - began:.0f}s", file=sys.stderr)
        figures = _check_and_build(conn, finished, queued)
    wait_idle_autovacuum(stack)
    page = (
        f"select * from {S}.list_jobs(status => %(status)s, kind => %(kind)s, queue => %(queue)s,"
        " idempotency_key => %(idempotency_key)s, since => %(since)s, until => %(until)s,"
        " before_id => %(before_id)s, before_finished_at => %(before_finished_at)s)"
    )
    count = (
        f"select {S}.count_jobs(status => %(status)s, kind => %(kind)s, queue => %(queue)s,"
        " idempotency_key => %(idempotency_key)s, since => %(since)s, until => %(until)s)"
    )
    with stack.cluster.connect(autocommit=True) as conn:
        now = conn.execute("select now()").fetchone()[0]
        window = (now - timedelta(days=3, hours=1), now - timedelta(days=3))
        (middle_id,) = conn.execute(
            f"select percentile_disc(0.5) within group (order by id) from {S}.live_jobs"
        ).fetchone()
        (key,) = conn.execute(
            f"select h.idempotency_key from {S}.job_history as h where h.idempotency_key <> ''"
            f" order by h.id limit 1 offset (select count(h.idempotency_key) / 2"
            f" from {S}.job_history as h)"
        ).fetchone()
        for name, (status, filters) in CASES.items():
            if "idempotency_key" in filters:
                filters = {"idempotency_key": key}
            args = dict.fromkeys(("kind", "queue", "idempotency_key", "since", "until"))
            args |= _arguments(filters, window) | {"status": status}
            deep = {"before_id": middle_id, "before_finished_at": None}
            if status in ("done", "failed", "cancelled"):
                deep = {"before_id": 2**62, "before_finished_at": now - timedelta(days=3.5)}
                if filters.get("window"):
                    deep["before_finished_at"] = now - timedelta(days=3, minutes=30)
            first = args | {"before_id": None, "before_finished_at": None}
            for figure, sql, call_args in (
                ("first", page, first),
                ("deep", page, args | deep),
                ("count", count, args),
            ):
                _call(conn, sql, call_args)  # warm
                times = [_call(conn, sql, call_args) for _ in range(CALLS)]
                figures[f"{name}_{figure}_ms"] = statistics.median(times)
                scans = ", ".join(_indexes(conn, sql, call_args))
                took = figures[f"{name}_{figure}_ms"]
                print(f"bench: job_list {name} {figure}: {took:.1f} ms; {scans}", file=sys.stderr)
            rows = conn.execute(page, first).fetchall()
            if status not in ("running",) and not rows:
                raise RuntimeError(f"job_list: {name} found no job")
    return figures
