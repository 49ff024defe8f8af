"""Jobs of an app's signed-in users (docs/client-jobs.md), through their SQL as the Data API runs
it (role `authenticated`, the user's claims): what a page of `my_jobs` costs a user with many
finished jobs, and what one submit costs under the rate and caps."""

from __future__ import annotations

import json
import statistics
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg.types.json import Jsonb

from .queue_sql import reset, state_tables
from .stack import SCHEMA, Stack, wait_idle_autovacuum

S = SCHEMA
KIND = "bench_export"
# reads of the page, and submits, timed (the median is the figure)
CALLS = 50
# other users' jobs beside the measured user's, as many as theirs in all
OTHER_USERS = 10


@contextmanager
def as_user(conn: psycopg.Connection, user: uuid.UUID) -> Iterator[None]:
    """A transaction as PostgREST runs a signed-in user's request."""
    claims = json.dumps({"role": "authenticated", "sub": str(user)})
    with conn.transaction():
        conn.execute(
            "select set_config('role', 'authenticated', true),"
            " set_config('request.jwt.claims', %s, true)",
            (claims,),
        )
        yield


def finish_all(conn: psycopg.Connection) -> None:
    """Claims and completes every queued job, one in three with a result (kept in job_history,
    the others in done_batches), as the workers would have."""
    while rows := conn.execute(f"select id, lock_token from {S}.claim('bench', 1000)").fetchall():
        for job_id, token in rows[::3]:
            conn.execute(f"select {S}.complete(%s, %s, %s)", (job_id, token, Jsonb({"file": "x"})))
        rest = [row for n, row in enumerate(rows) if n % 3]
        conn.execute(
            f"select {S}.complete_many(%s, %s)", ([r[0] for r in rest], [r[1] for r in rest])
        )


def my_jobs_page(stack: Stack, finished: int) -> dict[str, float]:
    """`finished` finished jobs of one user (and as many of OTHER_USERS others), then the
    newest 20 of theirs read from `my_jobs` as the Data API asks for a page (`order=id.desc`,
    `limit=20`), and one submit of a user with a few jobs queued (its rate and caps checked):
    each the median of CALLS, in ms."""
    reset(stack)
    user = uuid.uuid4()
    with stack.cluster.connect(autocommit=True) as conn:
        conn.execute(f"truncate {S}.client_kinds, {S}.client_jobs, {S}.client_rates")
        conn.execute(
            f"select {S}.allow_client_kind(%s, 10000, max_per_user => 10000, max_total => 1000000)",
            (KIND,),
        )
        for owner, jobs in [(user, finished)] + [
            (uuid.uuid4(), max(finished // OTHER_USERS, 1)) for _ in range(OTHER_USERS)
        ]:
            with as_user(conn, owner):
                conn.execute(
                    f"select {S}_public.client_enqueue(%s) from generate_series(1, %s)",
                    (KIND, jobs),
                )
            finish_all(conn)
        conn.execute(f"vacuum analyze {S}.client_jobs, {', '.join(state_tables(conn))}")
    wait_idle_autovacuum(stack)
    page = f"select * from {S}_public.my_jobs order by id desc limit 20"
    submit = f"select {S}_public.client_enqueue(%s)"
    times: dict[str, list[float]] = {"newest_20_ms": [], "submit_ms": []}
    submitter = uuid.uuid4()
    with stack.cluster.connect(autocommit=True) as conn:
        for _ in range(CALLS):
            began = time.perf_counter()
            with as_user(conn, user):
                rows = conn.execute(page).fetchall()
            times["newest_20_ms"].append((time.perf_counter() - began) * 1000)
            if len(rows) != 20:
                raise RuntimeError(f"my_jobs gave {len(rows)} rows, not 20")
            began = time.perf_counter()
            with as_user(conn, submitter):
                conn.execute(submit, (KIND,))
            times["submit_ms"].append((time.perf_counter() - began) * 1000)
    return {figure: statistics.median(values) for figure, values in times.items()}
