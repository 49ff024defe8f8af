# Test helper machinery: you should not need to edit this file (handlers live in handlers/).
"""The queue's clock in a test: jobs made due sooner, and a schedule's slot fired now.

The queue reads the database's now(), which a test cannot stop or set. What it can do is
bring the queued jobs' run_after back by an interval, which is what a retry's backoff or a
job enqueued for later waits on: after `advance(timedelta(minutes=5))` a job due in 5 minutes
is due now. It is a plain UPDATE of the queue's tables on a direct connection to the test
database (DATABASE_URL, or DB_URL as `supabase status -o env` prints it), no change to the
queue's SQL, and for tests only: the queued counts by due minute (the `queued_counts` view)
keep the moved jobs in the minute they were due until the queue next folds its counts.
"""

from __future__ import annotations

import os
from datetime import timedelta

import psycopg
from psycopg import sql

from ..settings import QUEUE_SCHEMA


def database_url(environ: dict[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    url = env.get("DATABASE_URL") or env.get("DB_URL")
    if not url:
        raise LookupError(
            "queue_clock needs a direct connection to the test database: set DATABASE_URL "
            "(or DB_URL, which `supabase status -o env` prints)"
        )
    return url


class QueueClock:
    """Moves the queue's time for the jobs of one queue (each call may name another)."""

    def __init__(self, url: str, queue: str) -> None:
        self.url, self.queue = url, queue

    def advance(self, by: timedelta | float, *, queue: str | None = None) -> int:
        """Make the queued jobs of `queue` (default: the test's) due `by` (a timedelta or
        seconds) sooner, as if that much time had passed for them; how many moved. Running
        jobs keep their leases."""
        interval = by if isinstance(by, timedelta) else timedelta(seconds=by)
        if interval < timedelta(0):
            raise ValueError(f"the queue's clock only goes forward: advance({by!r})")
        on = queue or self.queue
        schema = sql.Identifier(QUEUE_SCHEMA)
        jobs = sql.SQL(
            "update {}.jobs set run_after = run_after - %s where queue = %s and status = 'queued'"
        ).format(schema)
        # a batch of jobs enqueued together is due at once: its queued ones all move
        batches = sql.SQL(
            "with moved as (update {}.job_batches set run_after = run_after - %s"
            " where queue = %s returning size - taken as jobs)"
            " select coalesce(sum(jobs), 0)::integer from moved"
        ).format(schema)
        with psycopg.connect(self.url, autocommit=True) as db:
            moved = db.execute(jobs, (interval, on)).rowcount
            row = db.execute(batches, (interval, on)).fetchone()
        moved += row[0] if row else 0
        return moved

    def fire(self, schedule: str) -> int:
        """Enqueue the job of `schedule` for the current minute's slot now, as the queue's
        per-minute run does when a slot comes (`enqueue_scheduled`), whatever its cron
        expression; its id. LookupError for a schedule not defined."""
        with psycopg.connect(self.url, autocommit=True) as db:
            statement = sql.SQL("select {}.enqueue_scheduled(%s)").format(
                sql.Identifier(QUEUE_SCHEMA)
            )
            row = db.execute(statement, (schedule,)).fetchone()
        if row is None or row[0] is None:
            raise LookupError(f"no schedule named {schedule!r}: define it with schedule()")
        job_id: int = row[0]
        return job_id
