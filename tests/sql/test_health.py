"""health(): what stops wake-ups and rescues is said plainly, never skipped in silence; and a
database without pg_net still takes every migration."""

from __future__ import annotations

from pathlib import Path

import psycopg

from testkit.project import push_migrations, render
from testkit.stack import point_wake_ups, start_supabase_like_cluster, wait_for_pg_net
from tests.support.wake_signing import secret_for

KEY = secret_for("health-test-key-0123456789")


def health(db: psycopg.Connection) -> dict[str, tuple[bool, str]]:
    rows = db.execute("select component, ok, detail from pgqueue.health()").fetchall()
    return {component: (ok, detail) for component, ok, detail in rows}


def test_health_names_what_wake_ups_and_rescues_lack(db: psycopg.Connection) -> None:
    rows = health(db)
    assert rows["pg_net"] == (True, "pg_net is enabled and its worker is running")
    assert rows["worker_url"][0] is False
    assert "no worker URL, so no HTTP wake-up is sent" in rows["worker_url"][1]
    assert "app.pgqueue_worker_url" in rows["worker_url"][1], "it names the fix"
    assert rows["wake_secret"][0] is False
    assert "the Vault secret pgqueue_wake_secret" in rows["wake_secret"][1]
    # the test stack pauses the sweeper's pg_cron job
    assert rows["sweeper"][0] is False and "paused" in rows["sweeper"][1]
    assert rows["wake_up_responses"] == (True, "no pg_net response in the last 15 minutes")


def test_health_says_where_the_url_and_secret_come_from_never_the_secret(
    db: psycopg.Connection,
) -> None:
    point_wake_ups(db, "http://127.0.0.1:9/wake", KEY)
    rows = health(db)
    assert rows["worker_url"] == (
        True,
        "wake-ups go to the URL in the database setting app.pgqueue_worker_url",
    )
    assert rows["wake_secret"] == (
        True,
        "wake-ups are signed with the secret from the database setting app.pgqueue_wake_secret",
    )

    point_wake_ups(db, None, None)
    db.execute("select vault.create_secret(%s, 'pgqueue_wake_secret')", (KEY,))
    db.execute("select vault.create_secret('http://127.0.0.1:9/wake', 'pgqueue_worker_url')")
    rows = health(db)
    assert rows["worker_url"] == (
        True,
        "wake-ups go to the URL in the Vault secret pgqueue_worker_url",
    )
    assert rows["wake_secret"] == (
        True,
        "wake-ups are signed with the secret from the Vault secret pgqueue_wake_secret",
    )
    assert all(KEY not in detail for _, detail in rows.values())


POLLED = (
    "jobs wait for the workers' idle poll (every WORKER_POLL_INTERVAL seconds: 5 by default, "
    "30 with the postgres transport)"
)
NEVER_RUN = "no job runs (the Edge Function runs only when woken: it never polls)"


def test_health_says_what_a_missing_url_or_secret_costs(
    db: psycopg.Connection, config: dict
) -> None:
    """Workers that poll find jobs late without wake-ups; an Edge Function never runs them."""
    assert config["workers_poll"] is True
    rows = health(db)
    assert f"no worker URL, so no HTTP wake-up is sent and {POLLED}: set " in rows["worker_url"][1]
    assert rows["wake_secret"][1].startswith(
        f"no wake-up secret, so no HTTP wake-up is sent and {POLLED}"
    )
    assert rows["wake_secret"][1].endswith("give the worker the same one (WAKE_SECRET)")

    db.execute("""select pgqueue.configure('{"workers_poll": false}')""")
    rows = health(db)
    assert (
        f"no worker URL, so no HTTP wake-up is sent and {NEVER_RUN}: set " in rows["worker_url"][1]
    )
    assert rows["wake_secret"][1].startswith(
        f"no wake-up secret, so no HTTP wake-up is sent and {NEVER_RUN}"
    )
    assert rows["wake_secret"][1].endswith("give the worker the same one (PGQUEUE_WAKE_SECRET)")
    assert "fine for a worker that polls" not in repr(rows)


def test_an_edge_project_is_seeded_as_a_worker_that_never_polls(
    template: Path, tmp_path: Path
) -> None:
    cluster = start_supabase_like_cluster()
    try:
        project = render(template, tmp_path / "app", worker_style="edge", worker_url="")
        push_migrations(project, cluster.url())
        with cluster.connect(autocommit=True) as db:
            (config,) = db.execute("select pgqueue.configure()").fetchone()
            assert config["workers_poll"] is False
            assert NEVER_RUN in health(db)["wake_secret"][1]
    finally:
        cluster.destroy()


def test_health_reports_failed_wake_ups(db: psycopg.Connection) -> None:
    point_wake_ups(db, "http://127.0.0.1:9/wake", KEY)  # nothing listens on port 9
    db.execute("select pgqueue.enqueue('health.probe')")
    wait_for_pg_net(db)
    ok, detail = health(db)["wake_up_responses"]
    assert not ok
    assert detail.startswith("1 of 1 pg_net responses in the last 15 minutes failed; latest: ")
    assert "net._http_response" in detail
    point_wake_ups(db, None, None)


def test_without_pg_net_the_migrations_apply_and_health_says_so(
    template: Path, tmp_path: Path
) -> None:
    cluster = start_supabase_like_cluster(pg_net=False)
    try:
        project = render(template, tmp_path / "app", worker_style="python-http")
        push_migrations(project, cluster.url())
        with cluster.connect(autocommit=True) as db:
            assert (
                db.execute("select 1 from pg_extension where extname = 'pg_net'").fetchone() is None
            )
            point_wake_ups(db, "http://127.0.0.1:9/wake", KEY)
            (job_id,) = db.execute("select pgqueue.enqueue('no.pg_net')").fetchone()
            assert job_id is not None, "the INSERT commits without a wake-up"
            rows = health(db)
            assert rows["pg_net"][0] is False
            assert rows["pg_net"][1].startswith("pg_net is not enabled, so no HTTP wake-up is sent")
            assert rows["worker_url"][0] and rows["wake_secret"][0]
            assert "wake_up_responses" not in rows
    finally:
        cluster.destroy()


def test_health_says_when_wake_ups_cannot_be_signed(db: psycopg.Connection) -> None:
    """pgcrypto signs the wake-ups, in the schema _wake_signature() was written to call: moved
    elsewhere (or dropped), no wake-up can be signed, and health() says so instead of ok."""
    point_wake_ups(db, "http://127.0.0.1:9/wake", KEY)
    (schema,) = db.execute(
        "select extnamespace::regnamespace::text from pg_extension where extname = 'pgcrypto'"
    ).fetchone()
    db.execute("create schema moved_crypto; alter extension pgcrypto set schema moved_crypto")
    try:
        ok, detail = health(db)["wake_secret"]
    finally:
        db.execute(f"alter extension pgcrypto set schema {schema}; drop schema moved_crypto")
    assert ok is False
    assert detail.startswith("no wake-up is sent: wake-ups cannot be signed (")
    assert "create extension pgcrypto with schema extensions" in detail
    assert health(db)["wake_secret"][0] is True
