"""The peers. Each is driven through its documented API, with a no-op handler, in a database
of its own on the benchmark's cluster (same server, same durable settings):
- pgqueuer 1.6.0: five QueueManagers (one asyncpg connection each) in drain mode, batch 10,
  as its own benchmark runs it ("5 dequeuers x batch 10").
- procrastinate 3.10.0: one worker, concurrency 10, `wait=False` (drains, then returns).
- pgmq 1.5.1 (Supabase Queues): its SQL API through psycopg, exactly as our `sql_claim_*`
  scenarios drive ours (same processes, warm-up, prepared statements, job count and batch).

pgqueuer and procrastinate run in a process of their own: `python -m bench.peers NAME DSN
JOBS` prints one JSON object with the peer's bulk-enqueue and drain rates (jobs/s). pgmq's
scenarios are functions of the stack, like queue_sql's.
"""

from __future__ import annotations

import asyncio
import functools
import json
import multiprocessing
import sys
import time
from multiprocessing.synchronize import Event as EventType

import psycopg

from .queue_sql import (
    CLAIM_BATCH,
    ENQUEUE_BATCH,
    SINGLE_WARM_UP,
    ChurnQueue,
    ChurnStep,
    array_literal,
    run_claimers,
    run_senders,
    table_stats,
)
from .stack import Stack, wait_idle_autovacuum

PGQUEUER_DEQUEUERS = 5
PGQUEUER_BATCH = 10
PROCRASTINATE_CONCURRENCY = 10


async def pgqueuer(dsn: str, jobs: int) -> dict[str, float]:
    import asyncpg
    from pgqueuer import PgQueuer
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.models import Job
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    conn = await asyncpg.connect(dsn)
    queries = Queries(AsyncpgDriver(conn))
    if not await queries.has_table(queries.qbe.settings.queue_table):
        await queries.install()
    await queries.clear_queue()
    await queries.clear_queue_log()

    started = time.perf_counter()
    for first in range(0, jobs, ENQUEUE_BATCH):
        size = min(ENQUEUE_BATCH, jobs - first)
        await queries.enqueue(["noop"] * size, [None] * size, [0] * size)
    enqueue_s = time.perf_counter() - started

    async def noop(job: Job) -> None:
        return None

    apps = []
    for _ in range(PGQUEUER_DEQUEUERS):
        app = PgQueuer(AsyncpgDriver(await asyncpg.connect(dsn)))
        app.entrypoint("noop")(noop)
        apps.append(app)
    started = time.perf_counter()
    await asyncio.gather(
        *(app.qm.run(mode=QueueExecutionMode.drain, batch_size=PGQUEUER_BATCH) for app in apps)
    )
    drain_s = time.perf_counter() - started
    left = await conn.fetchval(f"select count(*) from {queries.qbe.settings.queue_table}")
    if left:
        raise RuntimeError(f"pgqueuer left {left} of {jobs} jobs in its queue")
    return {"enqueue_jobs_per_s": jobs / enqueue_s, "drain_jobs_per_s": jobs / drain_s}


async def procrastinate(dsn: str, jobs: int) -> dict[str, float]:
    import procrastinate as pc

    app = pc.App(connector=pc.PsycopgConnector(conninfo=dsn))

    @app.task(name="noop")
    async def noop() -> None:
        return None

    with psycopg.connect(dsn, autocommit=True) as conn:
        installed = conn.execute("select to_regclass('procrastinate_jobs')").fetchone()[0]
        if installed:
            conn.execute("truncate procrastinate_jobs cascade")
    async with app.open_async():
        if not installed:
            await app.schema_manager.apply_schema_async()
        started = time.perf_counter()
        for first in range(0, jobs, ENQUEUE_BATCH):
            await noop.batch_defer_async(*[{}] * min(ENQUEUE_BATCH, jobs - first))
        enqueue_s = time.perf_counter() - started
        started = time.perf_counter()
        await app.run_worker_async(
            wait=False,
            concurrency=PROCRASTINATE_CONCURRENCY,
            install_signal_handlers=False,
        )
        drain_s = time.perf_counter() - started
    with psycopg.connect(dsn) as conn:
        left = conn.execute(
            "select count(*) from procrastinate_jobs where status <> 'succeeded'"
        ).fetchone()[0]
    if left:
        raise RuntimeError(f"procrastinate left {left} of {jobs} jobs unfinished")
    return {"enqueue_jobs_per_s": jobs / enqueue_s, "drain_jobs_per_s": jobs / drain_s}


PEERS = {"pgqueuer": pgqueuer, "procrastinate": procrastinate}

PGMQ_QUEUE = "bench"  # a logged queue: its tables pgmq.q_bench and pgmq.a_bench
PGMQ_WARM_UP = "warm_up"  # an empty queue the drains warm up on
PGMQ_VT = 30  # seconds a read message stays invisible, as pgmq's docs read it
# every pgmq claimer's read(queue, vt, batch), and its delete or archive of the ids read (one
# array literal, as our claimers send theirs), which returns the count it finished
PGMQ_READ = "select msg_id from pgmq.read(%s, %s, %s)"


def pgmq_finish(finish: str = "delete") -> str:
    return f"select count(*) from pgmq.{finish}(%s, %s::bigint[])"


def pgmq_warm_up(conn: psycopg.Connection, finish: str = "delete") -> None:
    """Warm up on a queue nobody sends to: the statements prepared, the functions compiled."""
    conn.execute(PGMQ_READ, (PGMQ_WARM_UP, PGMQ_VT, CLAIM_BATCH), prepare=True).fetchall()
    conn.execute(pgmq_finish(finish), (PGMQ_WARM_UP, "{}"), prepare=True).fetchone()


def pgmq_ids(rows: list[tuple[int]]) -> str:
    """The ids a read returned, as the array literal its delete or archive takes."""
    return array_literal([msg_id for (msg_id,) in rows])


def pgmq_reset(stack: Stack, queued: int = 0) -> None:
    """pgmq installed, its queue empty and vacuumed, then `queued` messages (sent in one
    statement: setting up is not what is measured)."""
    with stack.cluster.connect("pgmq", autocommit=True) as conn:
        conn.execute("create extension if not exists pgmq")
        for queue in (PGMQ_QUEUE, PGMQ_WARM_UP):
            conn.execute("select pgmq.create(%s)", (queue,))
        tables = f"pgmq.q_{PGMQ_QUEUE}, pgmq.a_{PGMQ_QUEUE}"
        conn.execute(f"truncate {tables}")
        if queued:
            conn.execute(
                "select count(*) from pgmq.send_batch(%s, array("
                "select jsonb_build_object('n', n) from generate_series(1, %s) as n))",
                (PGMQ_QUEUE, queued),
            )
        conn.execute(f"vacuum analyze {tables}")
    wait_idle_autovacuum(stack)


# pgmq.send_batch(queue, jsonb[]) with its batch sent as one JSON array, which the server
# splits: the same one text parameter that enqueue_many(jsonb) takes. Passed a Python list of
# JSON strings instead, psycopg adapts it element by element on the client (3 to 4 us a
# message, 5 December: more than send_batch's own 3.4 us in the server), and that is what an
# earlier version of this scenario measured and compared.
PGMQ_SEND_BATCH = (
    "select count(*) from pgmq.send_batch(%s, array(select jsonb_array_elements(%s::jsonb)))"
)


def pgmq_send_batch(stack: Stack, jobs: int) -> dict[str, float]:
    """Bulk enqueue through pgmq.send_batch(queue, jsonb[]), ENQUEUE_BATCH messages a call, one
    connection, each batch one JSON text as enqueue_many's: that scenario's counterpart."""
    pgmq_reset(stack)
    batches = [
        json.dumps([{"n": n} for n in range(first, min(first + ENQUEUE_BATCH, jobs))])
        for first in range(0, jobs, ENQUEUE_BATCH)
    ]
    with stack.cluster.connect("pgmq", autocommit=True) as conn:
        started = time.perf_counter()
        for batch in batches:
            conn.execute(PGMQ_SEND_BATCH, (PGMQ_QUEUE, batch), prepare=True)
        elapsed = time.perf_counter() - started
        count = conn.execute(f"select count(*) from pgmq.q_{PGMQ_QUEUE}").fetchone()[0]
    if count != jobs:
        raise RuntimeError(f"pgmq.send_batch stored {count} of {jobs} messages")
    return {"jobs_per_s": jobs / elapsed}


def pgmq_send(stack: Stack, jobs: int, processes: int) -> dict[str, float]:
    """pgmq.send(queue, jsonb), one message a call and a transaction, `processes`
    connections sharing `jobs`: our enqueue_one scenario's counterpart."""
    pgmq_reset(stack)
    with stack.cluster.connect("pgmq", autocommit=True) as conn:
        conn.execute("select pgmq.create(%s)", (SINGLE_WARM_UP,))
    rate = run_senders(
        stack.dsn("pgmq"),
        "select pgmq.send(%(queue)s, %(payload)s::jsonb)",
        PGMQ_QUEUE,
        jobs,
        processes,
    )
    with stack.cluster.connect("pgmq", autocommit=True) as conn:
        count = conn.execute(f"select count(*) from pgmq.q_{PGMQ_QUEUE}").fetchone()
    if count is None or count[0] != jobs:
        raise RuntimeError(f"pgmq.send stored {count} of {jobs} messages")
    return {"jobs_per_s": rate}


def _pgmq_loop(dsn: str, name: str, go: EventType, out: multiprocessing.Queue, finish: str) -> None:
    """queue_sql._claim_loop's counterpart: read(q, 30, 100), then delete or archive the ids
    read, each call its own transaction, until read returns nothing."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        done_with = pgmq_finish(finish)
        pgmq_warm_up(conn, finish)
        go.wait()
        done = 0
        reading = 0.0  # time spent in read() calls, commits included
        while True:
            began = time.perf_counter()
            rows = conn.execute(
                PGMQ_READ, (PGMQ_QUEUE, PGMQ_VT, CLAIM_BATCH), prepare=True
            ).fetchall()
            reading += time.perf_counter() - began
            if not rows:
                break
            ids = pgmq_ids(rows)
            done += conn.execute(done_with, (PGMQ_QUEUE, ids), prepare=True).fetchone()[0]
        out.put((done, time.perf_counter(), reading))


def pgmq_drain(stack: Stack, jobs: int, processes: int, finish: str) -> dict[str, float]:
    """`processes` processes, each looping pgmq.read(q, 30, 100) + pgmq.<finish>(q, ids)
    (`delete` or `archive`) until the queue is empty: our sql_claim_* scenarios' counterpart."""
    pgmq_reset(stack, queued=jobs)
    loop = functools.partial(_pgmq_loop, finish=finish)
    rate = run_claimers(stack.dsn("pgmq"), jobs, processes, loop)[0]
    with stack.cluster.connect("pgmq") as conn:
        left = conn.execute(f"select count(*) from pgmq.q_{PGMQ_QUEUE}").fetchone()[0]
        archived = conn.execute(f"select count(*) from pgmq.a_{PGMQ_QUEUE}").fetchone()[0]
    if left or archived != (jobs if finish == "archive" else 0):
        raise RuntimeError(f"pgmq {finish}: {left} messages left, {archived} archived of {jobs}")
    return {"jobs_per_s": rate}


def main(argv: list[str]) -> int:
    name, dsn, jobs = argv
    print(json.dumps(asyncio.run(PEERS[name](dsn, int(jobs)))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


# -- pgmq under the churn scenario: topped up by send_batch(), drained by read + delete ------


def _pgmq_send(conn: psycopg.Connection, payloads: list[dict]) -> None:
    conn.execute(PGMQ_SEND_BATCH, (PGMQ_QUEUE, json.dumps(payloads)), prepare=True)


def _pgmq_claimer(conn: psycopg.Connection, batch: int = CLAIM_BATCH) -> ChurnStep:
    """read(q, 30, batch), then delete the ids read, as _pgmq_loop does."""
    delete = pgmq_finish("delete")
    pgmq_warm_up(conn)

    def step(conn: psycopg.Connection) -> int:
        rows = conn.execute(PGMQ_READ, (PGMQ_QUEUE, PGMQ_VT, batch), prepare=True).fetchall()
        if rows:
            conn.execute(delete, (PGMQ_QUEUE, pgmq_ids(rows)), prepare=True)
        return len(rows)

    return step


def _pgmq_all_deleted(stack: Stack, jobs: int) -> None:
    with stack.cluster.connect("pgmq") as conn:
        left = conn.execute(f"select count(*) from pgmq.q_{PGMQ_QUEUE}").fetchone()[0]
    if left:
        raise RuntimeError(f"pgmq churn: {left} of {jobs} messages left")


PGMQ_CHURN = ChurnQueue(
    "pgmq",
    pgmq_reset,
    _pgmq_send,
    _pgmq_claimer,
    _pgmq_all_deleted,
    functools.partial(table_stats, table=f"pgmq.q_{PGMQ_QUEUE}", dbname="pgmq"),
)
