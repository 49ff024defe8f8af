"""The rendered migrations and pgTAP suite, driven by the real Supabase CLI and pg_prove."""

from __future__ import annotations

import subprocess
from pathlib import Path

from testkit.cluster import Cluster
from testkit.hosted import start_hosted_cluster
from testkit.project import SUPABASE_CLI, push_migrations, render, run, supabase


def migration_versions(project: Path) -> list[str]:
    return sorted(p.name.split("_", 1)[0] for p in (project / "supabase/migrations").glob("*.sql"))


def test_cli_records_every_migration(project: Path, stack: Cluster) -> None:
    with stack.connect() as conn:
        applied = [
            r[0]
            for r in conn.execute(
                "select version from supabase_migrations.schema_migrations order by version"
            )
        ]
    assert applied == migration_versions(project)
    assert all(len(v) == 14 and v.isdigit() for v in applied)


def test_second_push_applies_nothing(project: Path, stack: Cluster) -> None:
    out = push_migrations(project, stack.url())
    assert "up to date" in out.lower()


def test_db_lint_finds_no_errors(project: Path, stack: Cluster) -> None:
    # run() fails the test unless the CLI exits 0; --fail-on error makes errors exit 1.
    supabase(
        project, "db", "lint", "--db-url", stack.url(), "--schema", "pgqueue", "--fail-on", "error"
    )


def test_db_lint_would_catch_a_broken_function(project: Path, stack: Cluster) -> None:
    """The lint above can fail: plpgsql_check reports a function that reads a missing column."""
    with stack.connect(autocommit=True) as conn:
        conn.execute(
            "create schema lint_probe;"
            "create function lint_probe.broken() returns bigint language plpgsql as"
            " $$ begin return (select no_such_column from pgqueue.all_jobs limit 1); end $$;"
        )
    try:
        proc = subprocess.run(
            [
                SUPABASE_CLI,
                "db",
                "lint",
                "--db-url",
                stack.url(),
                "-s",
                "lint_probe",
                "--fail-on",
                "error",
            ],
            cwd=project,
            capture_output=True,
            text=True,
        )
        assert proc.returncode != 0
        assert "no_such_column" in proc.stdout + proc.stderr
    finally:
        with stack.connect(autocommit=True) as conn:
            conn.execute("drop schema lint_probe cascade")


def test_pgtap_suite_passes(project: Path, stack: Cluster, db) -> None:
    tests = sorted((project / "supabase/tests/database").glob("*.test.sql"))
    assert tests, "the project ships pgTAP tests"
    out = run(["pg_prove", "-d", stack.dsn(user="postgres"), *tests])
    assert "All tests successful" in out


def test_non_default_answers_render_a_working_queue(template: Path, tmp_path: Path) -> None:
    answers = {
        "project_name": "Billing Jobs",
        "queue_schema": "billing_jobs",
        "service_key_setting": "billing.worker_key",
        "worker_url_setting": "billing.worker_url",
        "max_attempts": 3,
        "lease_seconds": 60,
        "sweep_schedule": "*/5 * * * *",
        "retention_days": 2,
    }
    project = render(template, tmp_path / "billing", **answers)
    cluster = start_hosted_cluster()
    try:
        push_migrations(project, cluster.url())
        supabase(
            project,
            "db",
            "lint",
            "--db-url",
            cluster.url(),
            "-s",
            "billing_jobs",
            "--fail-on",
            "error",
        )
        out = run(
            [
                "pg_prove",
                "-d",
                cluster.dsn(user="postgres"),
                *project.glob("supabase/tests/database/*.sql"),
            ]
        )
        assert "All tests successful" in out
        with cluster.connect(autocommit=True) as conn:
            assert conn.execute("select to_regnamespace('pgqueue')").fetchone() == (None,)
            job_id = conn.execute("select billing_jobs.enqueue('invoice.send')").fetchone()[0]
            row = conn.execute(
                "select max_attempts, locked_until - locked_at from billing_jobs.claim('w')"
            ).fetchone()
            assert row[0] == 3
            assert row[1].total_seconds() == 60
            assert conn.execute(
                "select schedule, command from cron.job where jobname = 'billing_jobs-sweep'"
            ).fetchone() == ("*/5 * * * *", "select billing_jobs.sweep()")
            assert conn.execute(
                "select status from billing_jobs.live_jobs where id = %s", (job_id,)
            ).fetchone() == ("running",)
    finally:
        cluster.destroy()
