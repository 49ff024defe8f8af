"""Issue 17's flow control, measured through complete_and_claim() (its correctness is tested in
tests/; these print figures):

- fairness: how soon the jobs of ten small concurrency keys start when a big key's backlog
  was enqueued before them, and what keys cost a drain;
- rate_limit: how many jobs claimers hammering a rate-limited queue start, and whether any
  window of the run exceeds the bucket's bound, burst + rate * T;
- concurrency_limit: how many jobs of a limited key run at once while claimers hold each job
  for a few milliseconds.
"""

from __future__ import annotations

import math
import multiprocessing
import threading
import time
from dataclasses import dataclass
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event as EventType
from typing import Any

import psycopg

from .queue_sql import CLAIM_BATCH, backend_cpu_s, gather_results, reset
from .stack import SCHEMA, Stack, wait_idle_autovacuum

S = SCHEMA
# Each call completes the batch the previous one claimed and claims the next. clock_timestamp()
# is read as the call returns its rows: after the claim took its rate-limit tokens, before
# its commit released the bucket (so the times are in the order the bucket served them).
CALL = (
    f"select id, lock_token, concurrency_key, clock_timestamp() from {S}.complete_and_claim("
    "%s, %s::bigint[], %s::uuid[], %s, null, %s)"
)
# rate_limit: when the claim that just ran in this transaction took its tokens.
TOKENS_TAKEN_AT = f"select tokens_at from {S}.queues where queue = %s"
WARM_UP = "warm-up"  # a queue nobody enqueues to: the statement is prepared on it

SMALL_KEYS = 10  # fairness: the small keys, each with SMALL_JOBS jobs
SMALL_JOBS = 10
BIG_KEY = "big"
RATED_QUEUE = "rated"
RATE_CLAIMERS = 4
LIMITED_KEY = "k"
LIMIT = 3
LIMIT_CLAIMERS = 4
HOLD_S = 0.005  # how long a concurrency_limit claimer holds each batch it claimed


def _small_key(n: int) -> str:
    return f"small-{n:02d}"


def _enqueue(
    conn: psycopg.Connection, jobs: int, key: str | None = None, queue: str = "default"
) -> None:
    """`jobs` no-op jobs of `queue` with concurrency key `key`, in one statement (setting up is
    not what is measured)."""
    conn.execute(
        f"insert into {S}.jobs (queue, kind, payload, concurrency_key) "
        "select %s, 'noop', jsonb_build_object('n', n), %s from generate_series(1, %s) as n",
        (queue, key, jobs),
    )


def _settle(stack: Stack, conn: psycopg.Connection) -> None:
    conn.execute(f"vacuum analyze {S}.jobs")
    wait_idle_autovacuum(stack)


@dataclass
class Drained:
    batches: list[list[str | None]]  # the concurrency keys of each batch claimed, in order
    seconds: float
    server_cpu_s: float  # the server backend's CPU time (user + system)


def _drain(conn: psycopg.Connection) -> Drained:
    """One claimer loops complete_and_claim(..., 100) until the queue is empty."""
    conn.execute(CALL, ("bench", [], [], CLAIM_BATCH, WARM_UP), prepare=True).fetchall()
    pid = conn.execute("select pg_backend_pid()").fetchone()[0]
    batches: list[list[str | None]] = []
    ids: list[int] = []
    tokens: list[Any] = []
    server = backend_cpu_s(pid)
    started = time.perf_counter()
    while True:
        rows = conn.execute(CALL, ("bench", ids, tokens, CLAIM_BATCH, "default"), prepare=True)
        rows = rows.fetchall()
        if not rows:
            break
        ids, tokens = [row[0] for row in rows], [row[1] for row in rows]
        batches.append([row[2] for row in rows])
    elapsed = time.perf_counter() - started
    server = backend_cpu_s(pid) - server
    left = conn.execute(f"select count(*) from {S}.jobs").fetchone()[0]
    if left:
        raise RuntimeError(f"the drain left {left} jobs in {S}.jobs")
    return Drained(batches, elapsed, server)


def fairness(stack: Stack, big: int) -> dict[str, float]:
    """`big` jobs of key BIG_KEY, then SMALL_KEYS keys of SMALL_JOBS jobs each, enqueued after
    them (first in, first out would start them last); one claimer drains them. In which batch
    (1-based) each small key's first and last job started, and the batch by which all had;
    then the jobs/s and server CPU per job of that drain and of an unkeyed drain of as many
    jobs (the CPU figure, which load elsewhere on the machine barely moves, says what keys
    cost)."""
    small = [_small_key(n) for n in range(1, SMALL_KEYS + 1)]
    total = big + SMALL_KEYS * SMALL_JOBS
    reset(stack)
    with stack.cluster.connect(autocommit=True) as conn:
        _enqueue(conn, big, BIG_KEY)
        for key in small:
            _enqueue(conn, SMALL_JOBS, key)
        _settle(stack, conn)
        keyed = _drain(conn)
    claimed = sum(len(batch) for batch in keyed.batches)
    if claimed != total:
        raise RuntimeError(f"fairness: claimed {claimed} of {total} keyed jobs")
    first: dict[str | None, int] = {}
    last: dict[str | None, int] = {}
    for n, keys in enumerate(keyed.batches, 1):
        for key in keys:
            first.setdefault(key, n)
            last[key] = n
    figures: dict[str, float] = {}
    for n, key in enumerate(small, 1):
        figures[f"key_{n:02d}_first_batch"] = first[key]
        figures[f"key_{n:02d}_last_batch"] = last[key]
    figures["all_small_started_batch"] = max(last[key] for key in small)

    reset(stack, queued=total)
    with stack.cluster.connect(autocommit=True) as conn:
        unkeyed = _drain(conn)
    claimed = sum(len(batch) for batch in unkeyed.batches)
    if claimed != total:
        raise RuntimeError(f"fairness: the unkeyed drain claimed {claimed} of {total} jobs")
    figures["keyed_jobs_per_s"] = total / keyed.seconds
    figures["unkeyed_jobs_per_s"] = total / unkeyed.seconds
    figures["keyed_vs_unkeyed"] = unkeyed.seconds / keyed.seconds
    figures["keyed_server_cpu_us_per_job"] = keyed.server_cpu_s / total * 1e6
    figures["unkeyed_server_cpu_us_per_job"] = unkeyed.server_cpu_s / total * 1e6
    return figures


def _rate_claimer(
    dsn: str, name: str, go: EventType, stop: EventType, out: multiprocessing.Queue
) -> None:
    """Loops complete_and_claim() on RATED_QUEUE, without a pause, until `stop`; then completes
    its last batch and puts each claimed job's claim time (epoch seconds) on `out`."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(CALL, (name, [], [], CLAIM_BATCH, WARM_UP), prepare=True).fetchall()
        go.wait()
        claimed: list[float] = []
        ids: list[int] = []
        tokens: list[Any] = []
        while not stop.is_set():
            # The bucket's row stays locked by this transaction until it commits, so its
            # tokens_at is the moment this claim took its tokens: the time the guarantee is
            # about. (A clock read as the rows come back lags it by however long the rest of
            # the call took, and on a loaded machine that lag alone looked like an excess.)
            with conn.transaction():
                rows = conn.execute(
                    CALL, (name, ids, tokens, CLAIM_BATCH, RATED_QUEUE), prepare=True
                ).fetchall()
                taken_at = conn.execute(TOKENS_TAKEN_AT, (RATED_QUEUE,), prepare=True)
                taken = taken_at.fetchone()[0].timestamp()
            ids, tokens = [row[0] for row in rows], [row[1] for row in rows]
            claimed += [taken] * len(rows)
        conn.execute(CALL, (name, ids, tokens, 0, RATED_QUEUE)).fetchall()
    out.put(claimed)


def worst_excess(times: list[float], rate: float, burst: int) -> float:
    """The most jobs that started in a window of length T >= burst / rate beyond the bucket's
    bound, burst + rate * T (windows from one start to another; a shorter span counts as
    burst / rate long). At most 0 when the limit holds."""
    times = sorted(times)
    shortest = burst / rate
    worst = -math.inf
    for i, begin in enumerate(times):
        for j in range(i, len(times)):
            span = max(times[j] - begin, shortest)
            worst = max(worst, j - i + 1 - burst - rate * span)
    return worst


def most_in(times: list[float], seconds: float) -> int:
    """The most jobs that started within any `seconds` (a closed window)."""
    times = sorted(times)
    most, j = 0, 0
    for i, begin in enumerate(times):
        while j < len(times) and times[j] <= begin + seconds:
            j += 1
        most = max(most, j - i)
    return most


def rate_limit(stack: Stack, rate: float, burst: int, seconds: float) -> dict[str, float]:
    """set_rate_limit(RATED_QUEUE, rate, burst), more jobs queued there than the limit lets
    through, then RATE_CLAIMERS processes call complete_and_claim() on it without pause for
    `seconds`. The jobs claimed a second, the worst excess over burst + rate * T of any window
    T >= burst / rate (<= 0: the limit held), and the most jobs claimed in any second."""
    reset(stack)
    with stack.cluster.connect(autocommit=True) as conn:
        _enqueue(conn, 2 * (burst + math.ceil(rate * seconds)), queue=RATED_QUEUE)
        _settle(stack, conn)
        conn.execute(
            f"select {S}.set_rate_limit(%s, %s::numeric, %s::integer)", (RATED_QUEUE, rate, burst)
        )
    ctx = multiprocessing.get_context("fork")
    go, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=_rate_claimer, args=(stack.dsn(), f"rated-{i}", go, stop, out))
        for i in range(RATE_CLAIMERS)
    ]
    try:
        for proc in procs:
            proc.start()
        time.sleep(0.3 + 0.1 * RATE_CLAIMERS)  # connected and warmed up
        go.set()
        time.sleep(seconds)
        stop.set()
        times = [t for result in gather_results(out, procs, timeout=60) for t in result]
        for proc in procs:
            proc.join()
    finally:
        with stack.cluster.connect(autocommit=True) as conn:
            conn.execute(f"select {S}.set_rate_limit(%s, null)", (RATED_QUEUE,))
    if not times:
        raise RuntimeError(f"rate_limit: no job of queue {RATED_QUEUE} was claimed")
    return {
        "limit_jobs_per_s": rate,
        "burst_jobs": burst,
        "claimed_jobs": len(times),
        "claimed_jobs_per_s": len(times) / seconds,
        "worst_excess_jobs": worst_excess(times, rate, burst),
        "max_in_1s_jobs": most_in(times, 1.0),
    }


def _limited_claimer(
    dsn: str,
    name: str,
    jobs: int,
    completed: Synchronized,
    go: EventType,
    out: multiprocessing.Queue,
) -> None:
    """Loops complete_and_claim(), holding each batch it claims for HOLD_S before the next call
    completes it, until `jobs` jobs have been completed by all claimers together; puts the
    spans it held jobs (from the call that claimed them returning to the call that completes
    them being sent: inside the span they were running) and when it finished on `out`."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(CALL, (name, [], [], CLAIM_BATCH, WARM_UP), prepare=True).fetchall()
        go.wait()
        held: list[tuple[float, float, int]] = []
        ids: list[int] = []
        tokens: list[Any] = []
        since = 0.0
        while True:
            sent = time.perf_counter()
            rows = conn.execute(CALL, (name, ids, tokens, CLAIM_BATCH, "default"), prepare=True)
            rows = rows.fetchall()
            returned = time.perf_counter()
            if ids:
                held.append((since, sent, len(ids)))
                with completed.get_lock():
                    completed.value += len(ids)
            ids, tokens = [row[0] for row in rows], [row[1] for row in rows]
            if rows:
                since = returned
                time.sleep(HOLD_S)
            elif completed.value >= jobs:
                break
            else:
                time.sleep(0.001)  # the key is at its limit: another claimer's jobs first
    out.put((held, returned))


def _most_at_once(spans: list[tuple[float, float, int]]) -> int:
    """The most jobs held at once over `spans` (from, until, jobs); a span that ends when
    another begins does not overlap it."""
    events = sorted([(begin, 1, n) for begin, _, n in spans] + [(end, 0, n) for _, end, n in spans])
    most = running = 0
    for _, starts, n in events:
        running += n if starts else -n
        most = max(most, running)
    return most


def concurrency_limit(stack: Stack, jobs: int) -> dict[str, float]:
    """set_concurrency_limit(LIMITED_KEY, LIMIT), `jobs` jobs of that key, then LIMIT_CLAIMERS
    processes drain them, holding each claimed batch for HOLD_S, while another connection
    counts the key's running jobs as often as it can. The jobs/s, the most and the mean
    running jobs it counted, and the most jobs the claimers held at once (a lower bound on
    the jobs running at once that misses no moment)."""
    reset(stack)
    with stack.cluster.connect(autocommit=True) as conn:
        conn.execute(f"select {S}.set_concurrency_limit(%s, %s::integer)", (LIMITED_KEY, LIMIT))
        _enqueue(conn, jobs, LIMITED_KEY)
        _settle(stack, conn)
    ctx = multiprocessing.get_context("fork")
    go, out = ctx.Event(), ctx.Queue()
    completed = ctx.Value("q", 0)
    procs = [
        ctx.Process(
            target=_limited_claimer,
            args=(stack.dsn(), f"limited-{i}", jobs, completed, go, out),
        )
        for i in range(LIMIT_CLAIMERS)
    ]
    counts: list[int] = []
    sampling = threading.Event()

    def sample() -> None:
        with psycopg.connect(stack.dsn(), autocommit=True) as conn:
            count = (
                f"select count(*) from {S}.live_jobs"
                " where status = 'running' and concurrency_key = %s"
            )
            while not sampling.is_set():
                counts.append(conn.execute(count, (LIMITED_KEY,), prepare=True).fetchone()[0])
                time.sleep(0.0005)

    sampler = threading.Thread(target=sample)
    try:
        for proc in procs:
            proc.start()
        time.sleep(0.3 + 0.1 * LIMIT_CLAIMERS)  # connected and warmed up
        sampler.start()
        started = time.perf_counter()
        go.set()
        results = gather_results(out, procs, timeout=600)
        for proc in procs:
            proc.join()
    finally:
        sampling.set()
        if sampler.is_alive():
            sampler.join()
        with stack.cluster.connect(autocommit=True) as conn:
            conn.execute(f"select {S}.set_concurrency_limit(%s, null)", (LIMITED_KEY,))
            left = conn.execute(f"select count(*) from {S}.jobs").fetchone()[0]
    if left or completed.value != jobs:
        raise RuntimeError(
            f"concurrency_limit: {completed.value} of {jobs} jobs completed, {left} left"
        )
    spans = [span for held, _ in results for span in held]
    return {
        "jobs_per_s": jobs / (max(finished for _, finished in results) - started),
        "limit_jobs": LIMIT,
        "max_running_jobs": max(counts),
        "mean_running_jobs": sum(counts) / len(counts),
        "max_held_jobs": _most_at_once(spans),
        "sampler_reads": len(counts),
    }


# Issue 17's targets, as bounds on figures of these scenarios: (scenario, figure, at most).
TARGETS = (
    # the small keys' jobs all start within the first batches, not after the big key's
    ("fairness", "all_small_started_batch", 2),
    # no window of T >= burst / rate claims more than burst + rate * T
    ("rate_limit", "worst_excess_jobs", 0),
    ("concurrency_limit", "max_running_jobs", LIMIT),
    ("concurrency_limit", "max_held_jobs", LIMIT),
)


def targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target whose scenario was measured: the median and the worst (largest) run, and
    whether the worst run meets it (a limit must hold in every run, not in most)."""
    rows = []
    for scenario, figure, most in TARGETS:
        measured = summary.get(scenario, {}).get(figure)
        if measured is None:
            continue
        rows.append(
            {
                "scenario": scenario,
                "figure": figure,
                "at_most": most,
                "median": measured["median"],
                "worst": measured["max"],
                "met": measured["max"] <= most,
            }
        )
    return rows


def targets_table(rows: list[dict[str, Any]]) -> str:
    lines = []
    for row in rows:
        verdict = "met" if row["met"] else "NOT met"
        lines.append(
            f"target {row['scenario']} {row['figure']}: {row['median']:g} "
            f"(worst run {row['worst']:g}) <= {row['at_most']}: {verdict}"
        )
    return "\n".join(lines)
