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
from psycopg import sql
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


# The database settings a project rendered with the default answers reads its wake-up URL and
# secret from (copier.yml: worker_url_setting, service_key_setting).
WORKER_URL_SETTING = "app.pgqueue_worker_url"
WAKE_SECRET_SETTING = "app.pgqueue_wake_secret"


def point_wake_ups(conn: psycopg.Connection, url: str | None, secret: str | None) -> None:
    """Where the database's wake-ups go and the secret they carry, as a self-hosted project
    sets them: `alter database <db> set ...` (the queue reads them from the catalog, so a
    session's own SET changes nothing). None resets the setting. They outlive the session:
    the `db` fixture resets both (clear_wake_ups())."""
    for statement in wake_up_settings(conn.info.dbname, url, secret):
        conn.execute(statement)


def clear_wake_ups(conn: psycopg.Connection) -> None:
    point_wake_ups(conn, None, None)


def wake_up_settings(dbname: str, url: str | None, secret: str | None) -> list[sql.Composed]:
    """point_wake_ups() as statements."""
    return [
        sql.SQL("alter database {} set {} = {}").format(
            sql.Identifier(dbname), sql.SQL(name), sql.Literal(value)
        )
        if value
        else sql.SQL("alter database {} reset {}").format(sql.Identifier(dbname), sql.SQL(name))
        for name, value in ((WORKER_URL_SETTING, url), (WAKE_SECRET_SETTING, secret))
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
