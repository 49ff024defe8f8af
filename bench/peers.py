"""The peers, each run in a process of its own: `python -m bench.peers NAME DSN JOBS` prints
one JSON object with the peer's bulk-enqueue and drain rates (jobs/s).

Each peer is driven through its documented API, with a no-op handler, in a database of its
own on the benchmark's cluster (same server, same durable settings):
- pgqueuer 1.6.0: five QueueManagers (one asyncpg connection each) in drain mode, batch 10,
  as its own benchmark runs it ("5 dequeuers x batch 10").
- procrastinate 3.10.0: one worker, concurrency 10, `wait=False` (drains, then returns).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

ENQUEUE_BATCH = 1000  # the same batch size as our enqueue_many scenario
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
    import psycopg

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


def main(argv: list[str]) -> int:
    name, dsn, jobs = argv
    print(json.dumps(asyncio.run(PEERS[name](dsn, int(jobs)))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
