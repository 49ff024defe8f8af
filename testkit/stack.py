"""The stack tests and benchmarks run on: a real PostgreSQL 15 cluster shaped like a Supabase
database, and helpers for the queue on it.

Two shapes. The tests' session stack and the migration, upgrade and update tests use the
hosted shape (testkit/hosted.py: supautils and Supabase's own role set-up, `postgres` not a
superuser, migrations applied as `postgres`). start_supabase_like_cluster() here is the plain
shape, where `postgres` is the superuser, as on a self-hosted PostgreSQL: the benchmark, the
reliability suite's restart tests and a database without pg_net use it.

Real: PostgreSQL, pg_cron, pg_net and Supabase Vault (all three preloaded), pgTAP,
plpgsql_check. Stand-in in the plain shape (testkit/sql/, never in a generated project): the
Supabase baseline roles and schemas.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg.types.json import Jsonb

from .cluster import Cluster

SQL = Path(__file__).parent / "sql"


def start_supabase_like_cluster(*, pg_net: bool = True, **settings: str) -> Cluster:
    """pg_net=False: a database without pg_net (neither preloaded nor created), as a
    self-hosted Postgres may be."""
    if not pg_net:
        settings = {"shared_preload_libraries": "'pg_cron,supabase_vault'", **settings}
    cluster = Cluster(**({"settings": settings} if settings else {})).init().start()
    with cluster.connect(autocommit=True) as conn:
        conn.execute((SQL / "supabase_baseline.sql").read_text())
        conn.execute((SQL / "auth_functions.sql").read_text())
        lines = (SQL / "extensions.sql").read_text().splitlines()
        conn.execute(
            "\n".join(
                line for line in lines if pg_net or "extension if not exists pg_net" not in line
            )
        )
    return cluster


@contextmanager
def notify_listeners(cluster: Cluster, on: bool, schema: str = "pgqueue") -> Iterator[None]:
    """Inside the block, enqueues send NOTIFY (config.notify_listeners) as `on` says, as a
    project whose workers LISTEN (the postgres transport) or do not is seeded; after it, the
    setting is put back as it was."""
    with cluster.connect(autocommit=True) as conn:
        (config,) = conn.execute(f"select {schema}.configure()").fetchone()
        conn.execute(f"select {schema}.configure(%s)", (Jsonb({"notify_listeners": on}),))
    try:
        yield
    finally:
        with cluster.connect(autocommit=True) as conn:
            restore = {"notify_listeners": config["notify_listeners"]}
            conn.execute(f"select {schema}.configure(%s)", (Jsonb(restore),))


def point_wake_ups(conn: psycopg.Connection, url: str | None, key: str | None) -> None:
    """Where this session's wake-ups go and the key they carry: what `alter database postgres
    set ...` does for a self-hosted project, for one session. None clears the setting."""
    for sql, params in wake_up_settings(url, key):
        conn.execute(sql, params)


def wake_up_settings(url: str | None, key: str | None) -> list[tuple[str, tuple[str]]]:
    """point_wake_ups() as statements, for a session that replays them on each connect (the
    reliability suite's sweeper)."""
    return [
        ("select set_config('app.pgqueue_worker_url', %s, false)", (url or "",)),
        ("select set_config('app.service_role_key', %s, false)", (key or "",)),
    ]


def wait_for_pg_net(conn: psycopg.Connection, timeout: float = 10) -> None:
    """Until pg_net has sent every committed request and stored each outcome. Its worker
    deletes a batch from net.http_request_queue and inserts the responses into
    net._http_response in one transaction, so an empty queue means every response is in."""
    deadline = time.monotonic() + timeout
    while True:
        row = conn.execute("select count(*) from net.http_request_queue").fetchone()
        if row is not None and row[0] == 0:
            return
        if time.monotonic() > deadline:
            left = row[0] if row else "?"
            raise TimeoutError(f"pg_net still had {left} requests queued after {timeout}s")
        time.sleep(0.02)
