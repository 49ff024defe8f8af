"""Scenarios that drive the queue's SQL API directly with psycopg: the ceiling any worker on
top of it can reach, and the costs underneath (durable commits, wake-ups, table size)."""

from __future__ import annotations

import json
import multiprocessing
import os
import queue
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event as EventType
from pathlib import Path

import psycopg

from testkit.stack import notify_listeners

from .stack import SCHEMA, Stack, wait_idle_autovacuum

S = SCHEMA
CLAIM_BATCH = 100
ENQUEUE_BATCH = 1000


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[index]


def array_literal(values: list[int] | list[str]) -> str:
    """The array literal of job ids or lock tokens (digits; hex digits and dashes: nothing to
    quote), for a parameter cast to bigint[] or uuid[]: how every claimer here sends its ids
    and tokens, ours and pgmq's alike, as the generated worker does (its `_array()`). psycopg
    adapts a Python list element by element in Python, about 0.7 us an int and 1.5 a UUID
    (6 December 2026), which would be the client's cost and not the queue's."""
    return "{" + ",".join(map(str, values)) + "}"


def completion_literals(rows: list[tuple[int, str]]) -> tuple[str, str]:
    """The ids and the lock tokens of claimed `rows` ((id, token as text) each), as the two
    array literals a completion takes."""
    return array_literal([r[0] for r in rows]), array_literal([r[1] for r in rows])


# The queue's state that a scenario starts without: the jobs (those waiting for others too, and
# the workflows' edges), the finished jobs (history tables), and the flow control (paused and
# rate-limited queues, concurrency limits, the running jobs they count).
STATE_TABLES = (
    "job_batches",
    "jobs",
    "waiting_jobs",
    "job_dependencies",
    "job_workflows",
    "job_history",
    "done_batches",
    "claims",
    "claimed_keys",
    "job_releases",
    "queues",
    "concurrency_limits",
    "running_keys",
)


def state_tables(conn: psycopg.Connection) -> list[str]:
    """STATE_TABLES that the migrations have made, qualified."""
    return [
        f"{S}.{name}"
        for name in STATE_TABLES
        if conn.execute("select to_regclass(%s)", (f"{S}.{name}",)).fetchone()[0]
    ]


def reset(stack: Stack, queued: int = 0, as_rows: bool = False) -> None:
    """Empty, vacuumed state tables (jobs, history, flow control, where the migrations have
    them), then `queued` runnable no-op jobs, enqueued in one statement (setting up is not what
    is measured): by enqueue_many() calls of ENQUEUE_BATCH, as pgmq's drains get theirs from
    send_batch(), so stored as batches where the migrations have them; with `as_rows`, a row
    of the job table each, as jobs enqueued one at a time or with a priority are."""
    with stack.cluster.connect(autocommit=True) as conn:
        tables = state_tables(conn)
        conn.execute(f"truncate {', '.join(tables)}")
        enqueue_noop(conn, queued, as_rows)
        conn.execute(f"vacuum analyze {', '.join(tables)}")
    wait_idle_autovacuum(stack)


def enqueue_noop(conn: psycopg.Connection, jobs: int, as_rows: bool = False) -> None:
    """`jobs` runnable no-op jobs in one statement: by enqueue_many() calls of ENQUEUE_BATCH
    (stored as batches where the migrations have them), or with `as_rows` a row each."""
    if jobs and as_rows:
        conn.execute(
            f"insert into {S}.jobs (kind, payload) "
            f"select 'noop', jsonb_build_object('n', n) from generate_series(1, %s) as n",
            (jobs,),
        )
    elif jobs:
        conn.execute(
            f"select count(*) from generate_series(1, %(n)s, {ENQUEUE_BATCH}) as f, "
            f"lateral {S}.enqueue_many(("
            "select jsonb_agg(jsonb_build_object('kind', 'noop', 'payload',"
            " jsonb_build_object('n', n)) order by n)"
            f" from generate_series(f, least(f + {ENQUEUE_BATCH} - 1, %(n)s)) as n))",
            {"n": jobs},
        )


def live_job_count(conn: psycopg.Connection) -> int:
    """Live jobs, queued or running, wherever they are stored (rows or batches)."""
    return conn.execute(f"select count(*) from {S}.live_jobs").fetchone()[0]


def commit_latency(
    stack: Stack, samples: int, idle_samples: int, idle_s: float
) -> dict[str, float]:
    """A single-row INSERT in its own transaction: what one durable commit costs here, back to
    back; then the same after `idle_s` seconds of nothing from this client (`idle_samples`
    times), as the wake-up scenarios' isolated jobs come. A virtual machine whose idle CPUs
    are slow to wake pays for it there (the whole path, client, server and disk, woken)."""
    with stack.cluster.connect(autocommit=True) as conn:
        conn.execute("create table if not exists bench_commit (id bigint, at timestamptz)")

        def insert(i: int) -> float:
            started = time.perf_counter()
            conn.execute("insert into bench_commit values (%s, now())", (i,), prepare=True)
            return (time.perf_counter() - started) * 1000

        times = [insert(i) for i in range(samples)]
        after_idle = []
        for i in range(idle_samples):
            time.sleep(idle_s)
            after_idle.append(insert(i))
        conn.execute("drop table bench_commit")
    return {
        "p50_ms": percentile(times, 50),
        "p95_ms": percentile(times, 95),
        "after_idle_p50_ms": percentile(after_idle, 50),
    }


def enqueue_many(stack: Stack, jobs: int) -> dict[str, float]:
    """Bulk enqueue through enqueue_many(jsonb), ENQUEUE_BATCH jobs a call, one connection."""
    reset(stack)
    batches = [
        json.dumps([{"kind": "noop", "payload": {"n": n}} for n in range(first, first + size)])
        for first in range(0, jobs, ENQUEUE_BATCH)
        for size in [min(ENQUEUE_BATCH, jobs - first)]
    ]
    with stack.cluster.connect(autocommit=True) as conn:
        started = time.perf_counter()
        for batch in batches:
            conn.execute(
                f"select count(*) from {S}.enqueue_many(%s::jsonb)", (batch,), prepare=True
            )
        elapsed = time.perf_counter() - started
        count = live_job_count(conn)
    if count != jobs:
        raise RuntimeError(f"enqueue_many stored {count} of {jobs} jobs")
    return {"jobs_per_s": jobs / elapsed}


SINGLE_WARM_UP = "warm-up"  # a queue nobody counts: each sender's first call goes there


def enqueue_one(stack: Stack, jobs: int, processes: int, notify: bool = False) -> dict[str, float]:
    """`processes` connections share `jobs` enqueue() calls of one job each, every call its own
    durable transaction: an application that enqueues as it serves requests. With `notify`,
    each sends NOTIFY as for workers that LISTEN (config.notify_listeners, on as the postgres
    transport seeds it); without, as the supabase transport and Edge Functions seed it."""
    reset(stack)
    with notify_listeners(stack.cluster, notify, S):
        rate = run_senders(
            stack.dsn(),
            f"select {S}.enqueue('noop', %(payload)s::jsonb, queue => %(queue)s)",
            "default",
            jobs,
            processes,
        )
    with stack.cluster.connect(autocommit=True) as conn:
        count = conn.execute(f"select count(*) from {S}.jobs where queue = 'default'").fetchone()
    if count is None or count[0] != jobs:
        raise RuntimeError(f"enqueue stored {count} of {jobs} jobs")
    return {"jobs_per_s": rate}


def run_senders(dsn: str, statement: str, queue_name: str, jobs: int, processes: int) -> float:
    """Start `processes` processes that share `jobs` calls of `statement` (parameters `queue`
    and `payload`), one call a transaction, on `queue_name`; each first makes one call on
    SINGLE_WARM_UP, then waits for the go given to all at once. Jobs/s."""
    ctx = multiprocessing.get_context("fork")
    go, out = ctx.Event(), ctx.Queue()
    shares = [jobs // processes + (i < jobs % processes) for i in range(processes)]
    procs = [
        ctx.Process(target=_send_loop, args=(dsn, statement, queue_name, share, go, out))
        for share in shares
    ]
    started, results = run_together(procs, go, out)
    sent = sum(count for count, _ in results)
    if sent != jobs:
        raise RuntimeError(f"senders made {sent} of {jobs} calls")
    return jobs / (max(at for _, at in results) - started)


def _send_loop(
    dsn: str, statement: str, queue_name: str, count: int, go: EventType, out: multiprocessing.Queue
) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statement, {"queue": SINGLE_WARM_UP, "payload": "{}"}, prepare=True)
        go.wait()
        for n in range(count):
            params = {"queue": queue_name, "payload": json.dumps({"n": n})}
            conn.execute(statement, params, prepare=True)
        out.put((count, time.perf_counter()))


# A claimer process: (dsn, worker name, go signal, results queue). It connects and warms up,
# waits for the go signal, drains the queue, then puts (jobs completed, when it finished,
# seconds spent in its claiming calls) on the queue.
Claimer = Callable[[str, str, EventType, multiprocessing.Queue], None]


def _claim_loop(dsn: str, name: str, go: EventType, out: multiprocessing.Queue) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        claim = f"select id, lock_token::text from {S}.claim(%s, %s, null, %s)"
        complete = f"select count(*) from {S}.complete_many(%s::bigint[], %s::uuid[])"
        # Warm up on a job of its own: statements prepared, the functions' plans cached.
        queue = _warm_up_job(conn, name)
        rows = conn.execute(claim, (name, CLAIM_BATCH, queue), prepare=True).fetchall()
        conn.execute(complete, completion_literals(rows), prepare=True)
        go.wait()
        done = 0
        claiming = 0.0  # time spent in claim() calls, commits included
        while True:
            began = time.perf_counter()
            rows = conn.execute(claim, (name, CLAIM_BATCH, "default"), prepare=True).fetchall()
            claiming += time.perf_counter() - began
            if not rows:
                break
            done += conn.execute(complete, completion_literals(rows), prepare=True).fetchone()[0]
        out.put((done, time.perf_counter(), claiming))


def claim_loop(stack: Stack, jobs: int, processes: int) -> dict[str, float]:
    """`processes` processes, each looping claim(100) + complete_many() until the queue is empty:
    the jobs/s the SQL API allows with a no-op handler and nothing else in the way."""
    reset(stack, queued=jobs)
    return {"jobs_per_s": run_claimers(stack.dsn(), jobs, processes)[0]}


# Ids and tokens go as array literals (array_literal()), the tokens read as text.
HOT_PATH = (
    f"select id, lock_token::text from {S}.complete_and_claim("
    "%s, %s::bigint[], %s::uuid[], %s, null, %s)"
)


def _warm_up_job(conn: psycopg.Connection, name: str) -> str:
    """A queue of the claimer `name`'s own, holding one job for it to claim and complete before
    the go signal: a claim from an empty queue would leave the completion's statements unplanned
    until its first batch completed, inside the timed span (5 to 10 ms a connection, 5 December
    2026). The queue's name."""
    queue = f"{SINGLE_WARM_UP}-{name}"
    conn.execute(
        f"select {S}.enqueue_many(%s::jsonb)", (json.dumps([{"kind": "noop", "queue": queue}]),)
    )
    return queue


def _warm_up_hot(conn: psycopg.Connection, name: str) -> None:
    """complete_and_claim() warmed up on a job of its own: statement prepared, the plans of
    its claim and its completion cached."""
    queue = _warm_up_job(conn, name)
    rows = conn.execute(HOT_PATH, (name, "{}", "{}", CLAIM_BATCH, queue), prepare=True).fetchall()
    ids, tokens = completion_literals(rows)
    conn.execute(HOT_PATH, (name, ids, tokens, CLAIM_BATCH, queue), prepare=True).fetchall()


def _hot_loop(dsn: str, name: str, go: EventType, out: multiprocessing.Queue) -> None:
    """complete_and_claim() in a loop, each call completing the batch the previous one
    claimed: the call that finds the queue empty completes the last batch."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        _warm_up_hot(conn, name)
        go.wait()
        done = 0
        calling = 0.0  # time spent in complete_and_claim() calls, commits included
        rows: list[tuple[int, str]] = []
        while True:
            ids, tokens = completion_literals(rows)
            done += len(rows)
            began = time.perf_counter()
            rows = conn.execute(
                HOT_PATH, (name, ids, tokens, CLAIM_BATCH, "default"), prepare=True
            ).fetchall()
            calling += time.perf_counter() - began
            if not rows:
                break
        out.put((done, time.perf_counter(), calling))


def hot_loop(stack: Stack, jobs: int, processes: int, as_rows: bool = False) -> dict[str, float]:
    """`processes` processes, each looping complete_and_claim(100) until the queue is empty:
    the hot path's jobs/s, one round trip and one commit per batch. The jobs are enqueued as
    enqueue_many() stores them, or with `as_rows` a row each (see reset())."""
    reset(stack, queued=jobs, as_rows=as_rows)
    rate = run_claimers(stack.dsn(), jobs, processes, _hot_loop)[0]
    _check_all_done(stack, jobs)
    return {"jobs_per_s": rate}


# gauges(): calls of each read timed, the median reported
GAUGE_CALLS = 5


def gauges(stack: Stack, jobs: int, unfolded: int) -> dict[str, float]:
    """What the gauges cost with a backlog: `jobs` queued jobs stored as batches (enqueue_many()
    calls of ENQUEUE_BATCH) and as many again a row each, those due at times spread over the
    last day (a backlog that built up, one in a hundred a retry) with a few claimed; then
    `metrics()` and `select * from stats` timed, the median of GAUGE_CALLS calls each (issue
    38: at most 100 ms with a million queued jobs). Then the same after `unfolded` single
    enqueue() calls that no sweep has folded yet (each adds a row to job_counts): what a scrape
    costs just before the next sweep, after a busy minute."""
    reset(stack, queued=jobs)
    with stack.cluster.connect(autocommit=True) as conn:
        conn.execute(
            f"insert into {S}.jobs (kind, payload, run_after, attempts) "
            f"select 'noop', jsonb_build_object('n', n), now() - (n %% 86400) * interval '1 s',"
            f" (n %% 100 = 0)::int from generate_series(1, %s) as n",
            (jobs,),
        )
        conn.execute(f"select count(*) from {S}.claim('bench', 200)")
        conn.execute(f"vacuum analyze {', '.join(state_tables(conn))}")
    wait_idle_autovacuum(stack)
    figures = time_gauges(stack, "")
    with stack.cluster.connect(autocommit=True) as conn:
        conn.execute(
            f"select {S}.enqueue('noop', jsonb_build_object('n', n))"
            f" from generate_series(1, %s) as n",
            (unfolded,),
        )
        conn.execute(f"analyze {S}.job_counts")
        queued = conn.execute(
            f"select sum(value) from {S}.metrics() where metric = 'pgqueue_jobs_queued'"
        ).fetchone()[0]
    expected = 2 * jobs - 200 + unfolded
    if queued != expected:
        raise RuntimeError(f"metrics() counts {queued} queued jobs, not {expected}")
    return figures | time_gauges(stack, "_unfolded")


def time_gauges(stack: Stack, suffix: str) -> dict[str, float]:
    """metrics() and `select * from stats`, each the median of GAUGE_CALLS calls, in ms."""
    figures: dict[str, float] = {}
    with stack.cluster.connect(autocommit=True) as conn:
        for figure, sql in (
            ("metrics_ms", f"select * from {S}.metrics()"),
            ("stats_ms", f"select * from {S}.stats"),
        ):
            conn.execute(sql)  # planned and cached once
            times = []
            for _ in range(GAUGE_CALLS):
                began = time.perf_counter()
                conn.execute(sql).fetchall()
                times.append((time.perf_counter() - began) * 1000)
            figures[figure.replace("_ms", suffix + "_ms")] = statistics.median(times)
    return figures


# call_cost's batch sizes, and the most calls it makes at each
CALL_COST_SIZES = (1, 10, 100, 250)
CALL_COST_CALLS = 2_000


def backend_cpu_s(pid: int) -> float:
    """CPU time (user + system) the server process `pid` has used: the scheduler's count in
    ns, or /proc/<pid>/stat's clock ticks (10 ms) where there is no schedstat."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _check_all_done(stack: Stack, jobs: int) -> None:
    """The hot path reports no completions back: check that every job is kept as done."""
    with stack.cluster.connect() as conn:
        left = live_job_count(conn)
        done = conn.execute(
            f"select count(*) from {S}.all_jobs where status = 'done' and queue = 'default'"
        ).fetchone()[0]
    if left or done != jobs:
        raise RuntimeError(f"complete_and_claim: {left} jobs left, {done} of {jobs} done")


def run_claimers(
    dsn: str, jobs: int, processes: int, claimer: Claimer = _claim_loop
) -> tuple[float, float]:
    """Start `processes` claimers on the database at `dsn`, give them the go together once they
    are warmed up, and wait until they have drained `jobs` jobs: jobs/s, and microseconds per
    job spent in their claiming calls."""
    ctx = multiprocessing.get_context("fork")
    go, out = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=claimer, args=(dsn, f"bench-{i}", go, out)) for i in range(processes)
    ]
    started, results = run_together(procs, go, out)
    done = sum(count for count, _, _ in results)
    if done != jobs:
        raise RuntimeError(f"claimers completed {done} of {jobs} jobs")
    elapsed = max(at for _, at, _ in results) - started
    return jobs / elapsed, sum(claiming for _, _, claiming in results) / jobs * 1e6


def run_together(
    procs: list[BaseProcess], go: EventType, out: multiprocessing.Queue
) -> tuple[float, list]:
    """Start `procs`, give them the go together once they have connected and warmed up, and
    wait for what each puts on `out`: when the go was given, and their results."""
    for proc in procs:
        proc.start()
    time.sleep(0.3 + 0.1 * len(procs))  # connected and warmed up
    started = time.perf_counter()
    go.set()
    results = gather_results(out, procs, timeout=600)
    for proc in procs:
        proc.join()
    return started, results


def gather_results(out: multiprocessing.Queue, procs: list[BaseProcess], timeout: float) -> list:
    """What each of `procs` put on `out`. Fails as soon as one of them dies (its traceback is
    on stderr) instead of waiting out `timeout`."""
    results: list = []
    deadline = time.monotonic() + timeout
    while len(results) < len(procs):
        try:
            results.append(out.get(timeout=0.5))
        except queue.Empty:
            died = [p for p in procs if p.exitcode not in (None, 0)]
            if died or time.monotonic() > deadline:
                for proc in procs:
                    proc.kill()
                why = f"{len(died)} died" if died else f"no answer in {timeout:.0f}s"
                raise RuntimeError(f"bench processes: {why}; see their output above") from None
    return results


CHURN_CLAIMERS = 2

# One claimer's step in the churn and call-cost scenarios: claims a batch on the connection
# (finishing the batch it claimed before, as that queue's own loop does) and says how many
# jobs it claimed.
ChurnStep = Callable[[psycopg.Connection], int]


@dataclass(frozen=True)
class ChurnQueue:
    """What churn() and call_cost() drive: a queue's database, how it resets it with `backlog`
    jobs queued, sends a batch of payloads, makes a claimer's step of a batch size (CLAIM_BATCH
    unless given; warmed up on the connection), and checks afterwards that every job was
    finished, and its job table's autovacuums, dead rows and size (bytes, indexes included)."""

    dbname: str
    reset: Callable[[Stack, int], None]
    send: Callable[[psycopg.Connection, list[dict]], None]
    claimer: Callable[..., ChurnStep]  # (connection, batch size=CLAIM_BATCH)
    check: Callable[[Stack, int], None]
    table: Callable[[Stack], tuple[int, int, int]]


def _send_ours(conn: psycopg.Connection, payloads: list[dict]) -> None:
    batch = [{"kind": "noop", "payload": payload} for payload in payloads]
    conn.execute(
        f"select count(*) from {S}.enqueue_many(%s::jsonb)", (json.dumps(batch),), prepare=True
    )


def _claimer_ours(conn: psycopg.Connection, batch: int = CLAIM_BATCH) -> ChurnStep:
    """complete_and_claim(batch), each call completing the batch the previous one claimed."""
    name = f"churn-{conn.info.backend_pid}"
    _warm_up_hot(conn, name)
    last: list[tuple[int, str]] = []

    def step(conn: psycopg.Connection) -> int:
        nonlocal last
        ids, tokens = completion_literals(last)
        last = conn.execute(
            HOT_PATH, (name, ids, tokens, batch, "default"), prepare=True
        ).fetchall()
        return len(last)

    return step


def _churn_enqueuer(
    dsn: str,
    queue: ChurnQueue,
    jobs: int,
    backlog: int,
    go: EventType,
    enqueued: EventType,
    claimed: Synchronized,
) -> None:
    """Batches of ENQUEUE_BATCH whenever fewer than `backlog` jobs are queued, until `jobs`
    (those queued before the go included) have been enqueued."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        go.wait()
        sent = backlog  # queued before the go
        try:
            while sent < jobs:
                if sent - claimed.value >= backlog:
                    time.sleep(0.001)
                    continue
                size = min(ENQUEUE_BATCH, jobs - sent)
                queue.send(conn, [{"n": n} for n in range(sent, sent + size)])
                sent += size
        finally:
            enqueued.set()  # (if it failed too: the claimers stop, the check below fails)


def _churn_claimer(
    dsn: str,
    queue: ChurnQueue,
    go: EventType,
    enqueued: EventType,
    claimed: Synchronized,
    out: multiprocessing.Queue,
) -> None:
    """The queue's claimer step in a loop, waiting for more jobs while the enqueuer is at
    work; puts (when, jobs) of each claim on `out`."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        step = queue.claimer(conn)
        go.wait()
        claims: list[tuple[float, int]] = []
        while True:
            last = enqueued.is_set()  # before the call: then an empty answer means drained
            count = step(conn)
            if count:
                claims.append((time.perf_counter(), count))
                with claimed.get_lock():
                    claimed.value += count
            elif last:
                break
            else:
                time.sleep(0.001)
        out.put(claims)


def _churn_vacuumer(dsn: str, every: float, stop: EventType, vacuums: Synchronized) -> None:
    """VACUUM the job table every `every` seconds until `stop` is set."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stop.wait(every):
            conn.execute(f"vacuum (skip_locked) {S}.jobs")
            vacuums.value += 1


def churn(
    stack: Stack,
    jobs: int,
    segment: int,
    backlog: int,
    vacuum_every: float | None = None,
    queue: ChurnQueue | None = None,
) -> dict[str, float]:
    """`jobs` jobs through the table as in production: one process enqueues in batches,
    topping the queue up to about `backlog` jobs, while CHURN_CLAIMERS processes drain with
    complete_and_claim(100) (or `queue`'s claims: pgmq's read + delete). No vacuum but
    autovacuum's, at its defaults and the table's own settings, unless `vacuum_every`
    (seconds) is given: then a side process also runs VACUUM on our job table that often (a
    what-if: nothing in the queue does that). The claim rate of each `segment` jobs in turn,
    and the last's over the first's: does the table slow down as dead rows pile up?"""
    queue = queue or OURS
    queue.reset(stack, backlog)
    ctx = multiprocessing.get_context("fork")
    go, enqueued, out = ctx.Event(), ctx.Event(), ctx.Queue()
    drained, vacuums = ctx.Event(), ctx.Value("q", 0)
    claimed = ctx.Value("q", 0)
    dsn = stack.dsn(queue.dbname)
    procs = [
        ctx.Process(
            target=_churn_enqueuer, args=(dsn, queue, jobs, backlog, go, enqueued, claimed)
        ),
        *(
            ctx.Process(target=_churn_claimer, args=(dsn, queue, go, enqueued, claimed, out))
            for _ in range(CHURN_CLAIMERS)
        ),
    ]
    vacuumer = (
        ctx.Process(target=_churn_vacuumer, args=(dsn, vacuum_every, drained, vacuums))
        if vacuum_every
        else None
    )
    autovacuums_before = queue.table(stack)[0]
    for proc in procs:
        proc.start()
    time.sleep(0.5)  # connected and warmed up
    started = time.perf_counter()
    if vacuumer is not None:
        vacuumer.start()
    go.set()
    try:
        claims = sorted(
            c for result in gather_results(out, procs[1:], timeout=1800) for c in result
        )
    finally:
        drained.set()
        if vacuumer is not None:
            vacuumer.join()
    for proc in procs:
        proc.join()
    queue.check(stack, jobs)
    # when the claims reached each multiple of `segment`
    ends, total = [], 0
    for at, count in claims:
        total += count
        while total >= segment * (len(ends) + 1):
            ends.append(at)
    rates = [segment / (end - begin) for begin, end in zip([started, *ends], ends, strict=False)]
    figures = {f"segment_{n:02d}_jobs_per_s": rate for n, rate in enumerate(rates, 1)}
    figures["overall_jobs_per_s"] = jobs / (claims[-1][0] - started)
    figures["last_vs_first"] = rates[-1] / rates[0]
    autovacuums, dead_rows, size = queue.table(stack)
    figures["autovacuums"] = autovacuums - autovacuums_before
    if vacuumer is not None:
        figures["vacuums"] = vacuums.value
    figures["dead_rows_at_end"] = dead_rows
    figures["jobs_table_mb_at_end"] = size / 2**20
    return figures


def table_stats(
    stack: Stack, table: str = f"{S}.jobs", dbname: str = "postgres"
) -> tuple[int, int, int]:
    """A table's autovacuum runs so far, its dead rows, and its size with its indexes (bytes):
    our job table unless told otherwise."""
    with stack.cluster.connect(dbname) as conn:
        return conn.execute(
            "select autovacuum_count, n_dead_tup, pg_total_relation_size(relid) "
            "from pg_stat_user_tables where relid = %s::regclass",
            (table,),
        ).fetchone()


OURS = ChurnQueue("postgres", reset, _send_ours, _claimer_ours, _check_all_done, table_stats)


def call_cost(stack: Stack, jobs: int, queue: ChurnQueue = OURS) -> dict[str, float]:
    """What a claiming call costs the server however many jobs it takes, and what each job adds:
    one connection drains `queue` with its claimer's step (for us complete_and_claim(), for
    pgmq the pair read + delete, durable commits) at each of CALL_COST_SIZES jobs a step, at
    most CALL_COST_CALLS steps each. The server process's CPU per step at each size, its
    least-squares fit to `fixed + per_job * size`, and the fixed part's share of a step of
    CLAIM_BATCH jobs."""
    per_call: dict[int, float] = {}
    for size in CALL_COST_SIZES:
        drained = min(jobs, size * CALL_COST_CALLS)
        queue.reset(stack, drained)
        with psycopg.connect(stack.dsn(queue.dbname), autocommit=True) as conn:
            step = queue.claimer(conn, size)
            pid = conn.info.backend_pid
            calls = 1  # (the last step, which finds nothing, counts too)
            began = backend_cpu_s(pid)
            while step(conn):
                calls += 1
            per_call[size] = (backend_cpu_s(pid) - began) / calls * 1e6
        queue.check(stack, drained)
    per_job, fixed = statistics.linear_regression(list(per_call), list(per_call.values()))
    return {
        **{f"server_us_per_call_of_{size}": us for size, us in per_call.items()},
        "fixed_server_us_per_call": fixed,
        "server_us_per_job": per_job,
        "fixed_share_at_100": fixed / (fixed + per_job * CLAIM_BATCH),
    }


def finished_rows(stack: Stack, jobs: int, finished: int, repeats: int) -> dict[str, list[float]]:
    """complete_and_claim(100) jobs/s (one process) with an empty history, then with `finished`
    finished jobs kept: a tenth as dead letters in pgqueue.job_history, the rest done in
    pgqueue.done_batches, vacuumed and analyzed as autovacuum leaves tables at rest. Also the
    calls' own cost per job, which the history's size could slow down. Once with the jobs
    stored as enqueue_many() stores them, then (figures prefixed `rows_`) a row each; each
    storage is compared with itself, or the ratio would also compare two storages."""
    figures = _finished_rows(stack, jobs, finished, repeats, as_rows=False)
    rows = _finished_rows(stack, jobs, finished, repeats, as_rows=True)
    return figures | {f"rows_{figure}": values for figure, values in rows.items()}


def _finished_rows(
    stack: Stack, jobs: int, finished: int, repeats: int, as_rows: bool
) -> dict[str, list[float]]:
    empty, empty_call = [], []
    for _ in range(repeats):
        reset(stack, queued=jobs, as_rows=as_rows)
        rate, call_us = run_claimers(stack.dsn(), jobs, 1, _hot_loop)
        empty.append(rate)
        empty_call.append(call_us)
    full, full_call = [], []
    reset(stack)
    with stack.cluster.connect(autocommit=True) as conn:
        # ids from the jobs' own sequence, as the finished jobs would have had
        # a tenth as dead letters in the history, the rest done, by batches of 100
        dead = finished // 10
        conn.execute(
            f"insert into {S}.job_history (id, queue, kind, status, priority, attempts, "
            f"max_attempts, payload, last_error, created_at, finished_at) "
            f"select nextval('{S}.jobs_id_seq'), 'default', 'noop', 'failed', 0, 5, 5, "
            f"jsonb_build_object('n', n), 'boom', now() - interval '2 hours', "
            f"now() - interval '1 hour' from generate_series(1, %s) as n",
            (dead,),
        )
        conn.execute(
            f"insert into {S}.done_batches (queue, kind, finished_at, ids, attempts, created_at,"
            f" id_range) "
            f"select 'default', 'noop', now() - interval '1 hour', b.ids,"
            f" array_fill(1, array[cardinality(b.ids)]),"
            f" array_fill(now() - interval '2 hours', array[cardinality(b.ids)]),"
            f" int8range(b.ids[1], b.ids[cardinality(b.ids)], '[]') "
            f"from (select array_agg(nextval('{S}.jobs_id_seq') order by n) as ids"
            f" from generate_series(0, %s - 1) as n group by n / 100) as b",
            (finished - dead,),
        )
    for _ in range(repeats):
        with stack.cluster.connect(autocommit=True) as conn:
            # the previous repeat's jobs are in the history now too
            enqueue_noop(conn, jobs, as_rows)
            conn.execute(f"vacuum analyze {', '.join(state_tables(conn))}")
        wait_idle_autovacuum(stack)
        rate, call_us = run_claimers(stack.dsn(), jobs, 1, _hot_loop)
        full.append(rate)
        full_call.append(call_us)
    return {
        "empty_jobs_per_s": empty,
        "full_jobs_per_s": full,
        "full_vs_empty": [statistics.median(full) / statistics.median(empty)],
        "empty_call_us_per_job": empty_call,
        "full_call_us_per_job": full_call,
        "call_cost_full_vs_empty": [statistics.median(full_call) / statistics.median(empty_call)],
    }


def notify_latency(stack: Stack, samples: int, rate: float) -> dict[str, float]:
    """enqueue() at `rate` jobs/s from one connection; a second connection LISTENs on the
    queue's channel. Latency: from the start of the enqueue call (its durable commit
    included) to the notification's arrival at the listener."""
    reset(stack)
    received: list[float] = []
    listening = threading.Event()

    def listen() -> None:
        with psycopg.connect(stack.dsn(), autocommit=True) as conn:
            conn.execute(f"listen {S}")
            listening.set()
            for _ in conn.notifies(timeout=samples / rate + 10, stop_after=samples + 1):
                received.append(time.perf_counter())

    listener = threading.Thread(target=listen)
    listener.start()
    listening.wait(10)
    sent: list[float] = []
    committed: list[float] = []
    with psycopg.connect(stack.dsn(), autocommit=True) as conn:
        enqueue = f"select {S}.enqueue('noop')"
        conn.execute(enqueue, prepare=True)  # warm-up; its notification is not counted
        time.sleep(0.2)
        interval = 1 / rate
        next_at = time.perf_counter()
        for _ in range(samples):
            while (now := time.perf_counter()) < next_at:
                time.sleep(min(0.001, next_at - now))
            sent.append(time.perf_counter())
            conn.execute(enqueue, prepare=True)
            committed.append(time.perf_counter())
            next_at += interval
    listener.join()
    received = received[1:]  # the warm-up's
    if len(received) < samples:
        raise RuntimeError(f"the listener got {len(received)} of {samples} notifications")
    latency = [(r - s) * 1000 for r, s in zip(received, sent, strict=False)]
    after_commit = [(r - c) * 1000 for r, c in zip(received, committed, strict=False)]
    return {
        "p50_ms": percentile(latency, 50),
        "p95_ms": percentile(latency, 95),
        "p99_ms": percentile(latency, 99),
        "enqueue_call_p50_ms": percentile(
            [(c - s) * 1000 for c, s in zip(committed, sent, strict=True)], 50
        ),
        "after_commit_returned_p50_ms": percentile(after_commit, 50),
    }
