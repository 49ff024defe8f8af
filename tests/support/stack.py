"""The test stack: a real PostgreSQL 15 cluster shaped like a Supabase database.

Real: PostgreSQL, pg_cron (preloaded), pgTAP, plpgsql_check. Stand-ins (this folder only,
never in a generated project): pg_net and its worker, Supabase Vault, and the Supabase
baseline roles and schemas.
"""

from __future__ import annotations

from pathlib import Path

import psycopg

from .cluster import Cluster

SQL = Path(__file__).parent / "sql"


def start_supabase_like_cluster(**settings: str) -> Cluster:
    cluster = Cluster(**({"settings": settings} if settings else {})).init().start()
    with cluster.connect(autocommit=True) as conn:
        for name in ("supabase_baseline.sql", "pg_net.sql", "vault.sql"):
            conn.execute((SQL / name).read_text())
    return cluster


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
