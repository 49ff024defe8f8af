"""The stack is shaped like a hosted Supabase database (testkit/hosted.py): `postgres`, as which
the Supabase CLI applies every migration, is not a superuser, and supautils guards what hosted
Supabase guards. So a migration that needs a superuser fails its push here, as it would fail
on a user's hosted project."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from testkit.cluster import Cluster
from testkit.hosted import EXPECTED_FAILURES, HostedSetupError, build_hosted_cluster
from testkit.project import SUPABASE_CLI


def test_postgres_is_not_a_superuser_and_applied_the_migrations(
    stack: Cluster, project: Path
) -> None:
    with stack.connect() as conn:
        roles = {
            name: flags
            for name, *flags in conn.execute(
                "select rolname, rolsuper, rolcreaterole, rolbypassrls from pg_roles"
                " where rolname in ('postgres', 'supabase_admin')"
            )
        }
        (preload,) = conn.execute("show shared_preload_libraries").fetchone()
        owners = conn.execute(
            "select distinct pg_get_userbyid(relowner) from pg_class"
            " where relnamespace = 'pgqueue'::regnamespace"
        ).fetchall()
        (cron_owner,) = conn.execute(
            "select username from cron.job where jobname = 'pgqueue-sweep'"
        ).fetchone()
    # as on a hosted project: postgres may create roles and bypasses RLS, and nothing more
    assert roles == {"postgres": [False, True, True], "supabase_admin": [True, True, True]}
    assert "supautils" in preload.split(",")
    # the CLI logged in as postgres: it owns what the migrations made, the sweep runs as it
    assert owners == [("postgres",)]
    assert cron_owner == "postgres"


# Statements a migration might try that a hosted project's `postgres` may not run, and the
# error each push fails with
NEEDS_SUPERUSER = {
    # why the queue reads its worker URL and key from Vault on a hosted project (§2 of DESIGN)
    "custom-setting": (
        "alter database postgres set app.pgqueue_worker_url = 'http://worker:8000/wake';",
        'permission denied to set parameter "app.pgqueue_worker_url"',
    ),
    # supautils' guard of reserved role memberships
    "reserved-membership": (
        "grant pg_read_server_files to postgres;",
        '"pg_read_server_files" role memberships are reserved, only superusers can grant them',
    ),
    # an untrusted extension that supautils does not create on postgres's behalf
    "untrusted-extension": (
        "create extension if not exists file_fdw with schema extensions;",
        'permission denied to create extension "file_fdw"',
    ),
}


@pytest.mark.parametrize("statement, error", NEEDS_SUPERUSER.values(), ids=NEEDS_SUPERUSER)
def test_a_migration_that_needs_a_superuser_fails_its_push(
    project: Path, stack: Cluster, tmp_path: Path, statement: str, error: str
) -> None:
    """The default project with one more migration, pushed by the CLI as `postgres` onto the
    stack that already has the others: the push fails with PostgreSQL's refusal, and the
    migration is not recorded."""
    copy = tmp_path / "myapp"
    shutil.copytree(project, copy, ignore=shutil.ignore_patterns(".git"))
    (copy / "supabase/migrations/20991231000000_needs_superuser.sql").write_text(statement + "\n")
    proc = subprocess.run(
        [SUPABASE_CLI, "db", "push", "--db-url", stack.url(), "--yes"],
        cwd=copy,
        capture_output=True,
        text=True,
        env={**os.environ, "DO_NOT_TRACK": "1"},
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    assert error in output
    assert "20991231000000_needs_superuser.sql" in output
    with stack.connect() as conn:
        recorded = conn.execute(
            "select count(*) from supabase_migrations.schema_migrations"
            " where version = '20991231000000'"
        ).fetchone()
    assert recorded == (0,)


def test_the_build_names_each_set_up_statement_that_fails_unlike_before() -> None:
    """The hosted-shaped build tolerates exactly the known failures of Supabase's set-up: one
    expected failure left out of the list, and one that does not happen added to it, are
    both reported."""
    pgjwt = ("00000000000000-initial-schema.sql", 'extension "pgjwt" is not available')
    imagined = ("10000000000000_demote-postgres.sql", "an error that does not happen")
    assert pgjwt in EXPECTED_FAILURES
    with pytest.raises(HostedSetupError) as raised:
        build_hosted_cluster(expected_failures=EXPECTED_FAILURES - {pgjwt} | {imagined})
    report = str(raised.value)
    assert f"  failed: {pgjwt[0]}: {pgjwt[1]}\n" in report
    assert f"  no longer fails: {imagined[0]}: {imagined[1]}\n" in report
    assert report.count("failed:") == 1 and report.count("no longer fails:") == 1
