"""Hostile surroundings: secrets in rendered files, and objects planted in `public` that try to
change what the queue's SECURITY DEFINER functions do."""

from __future__ import annotations

import re
import subprocess
from datetime import datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from testkit.cluster import Cluster
from testkit.postgrest import JWT_SECRET
from testkit.project import VARIANTS, Variant, render, rendered_files

SECRET_PATTERNS = {
    "JWT": re.compile(r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
    "Supabase secret key": re.compile(r"sb_secret_[A-Za-z0-9_-]{8,}"),
    "Supabase publishable key": re.compile(r"sb_publishable_[A-Za-z0-9_-]{8,}"),
    "password in a URL": re.compile(r"\b[a-z+]+://[^\s:/@<>]+:(?!\[|<|\.\.\.)[^\s@/<>]+@"),
    # a value that looks generated: 20+ characters mixing letters and digits
    "assigned key or password": re.compile(
        r"(?i)\b[A-Z_]*(?:KEY|SECRET|TOKEN|PASSWORD)\s*[=:]\s*[\"']?"
        r"(?=[A-Za-z0-9_\-]*[0-9])(?=[A-Za-z0-9_\-]*[A-Za-z])[A-Za-z0-9_\-]{20,}"
    ),
    "local JWT secret": re.compile(re.escape(JWT_SECRET)),
}


def find_secrets(project: Path) -> list[str]:
    return [
        f"{path.relative_to(project)}:{n}: {name}"
        for path in rendered_files(project)
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        for name, pattern in SECRET_PATTERNS.items()
        if pattern.search(line)
    ]


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_no_rendered_file_holds_a_key_token_or_password(
    template: Path, tmp_path: Path, variant: Variant
) -> None:
    project = render(template, tmp_path / "app", **variant.answers)
    assert find_secrets(project) == []


def test_the_secret_scan_finds_planted_secrets(template: Path, tmp_path: Path) -> None:
    project = render(template, tmp_path / "app")
    (project / "leak.env").write_text(
        "SERVICE_ROLE_KEY=eyJhbGciOiJIUzI1NiJ9.eyJyb2xlIjoic2VydmljZV9yb2xlIn0.abc\n"
        "DB_URL=postgresql://postgres:hunter2hunter2@db.example.com:5432/postgres\n"
        "SUPABASE_SECRET=sb_secret_abcdefghijklmnop\n"
        "RESEND_API_KEY=re_8f3kD02mXq71LpZ0aa9Qw2\n"
    )
    kinds = {line.split(": ", 1)[1] for line in find_secrets(project)}
    assert {"JWT", "password in a URL", "Supabase secret key", "assigned key or password"} <= kinds


HOSTILE = """
create function public.now() returns timestamptz language sql
  as $$ select '2000-01-01'::timestamptz $$;
create function public.gen_random_uuid() returns uuid language sql
  as $$ select '00000000-0000-0000-0000-000000000000'::uuid $$;
create function public.random() returns double precision language sql
  as $$ select 1000.0::float8 $$;
create function public.pg_notify(text, text) returns void language sql as $$ select $$;
create table public.jobs (like pgqueue.jobs);
"""


def test_objects_planted_in_public_do_not_change_the_queue(db: psycopg.Connection) -> None:
    db.execute(HOSTILE)
    try:
        db.execute("set search_path = public, pg_catalog")
        assert db.execute("select now()").fetchone()[0].year == 2000, "the trap is armed"
        db.execute("select pgqueue.enqueue_many(%s)", ('[{"kind": "a"}, {"kind": "b"}]',))
        db.execute("select pgqueue.enqueue('c', max_attempts => 3)")
        claimed = db.execute(
            "select id, lock_token, locked_at from pgqueue.claim('w', 3)"
        ).fetchall()
        assert len(claimed) == 3
        # one token per claim (the hot path's), drawn by pg_catalog's gen_random_uuid
        assert {str(token) for _, token, _ in claimed} - {"00000000-0000-0000-0000-000000000000"}
        assert all(
            abs(locked_at - datetime.now(locked_at.tzinfo)) < timedelta(minutes=5)
            for *_, locked_at in claimed
        )
        job_id, token, _ = claimed[0]
        assert db.execute("select pgqueue.fail(%s, %s, 'x')", (job_id, token)).fetchone() == (
            "queued",
        )
        delay = db.execute(
            "select run_after - pg_catalog.now() from pgqueue.all_jobs where id = %s", (job_id,)
        ).fetchone()[0]
        assert timedelta(seconds=2) < delay <= timedelta(seconds=5), "backoff used real random()"
        assert db.execute("select count(*) from public.jobs").fetchone() == (0,)
        assert db.execute("select count(*) from pgqueue.all_jobs").fetchone() == (3,)
    finally:
        db.execute("reset search_path")
        db.execute(
            "drop function public.now(), public.gen_random_uuid(), public.random(),"
            " public.pg_notify(text, text);"
            "drop table public.jobs"
        )


def test_the_projects_pgtap_suite_fails_on_a_queue_function_public_may_execute(
    project: Path, db: psycopg.Connection, stack: Cluster
) -> None:
    """PostgreSQL grants EXECUTE to PUBLIC on every new function, and no per-schema default
    privilege can take that back (issue 38, finding 6). A function a later migration adds to
    the queue schema without `revoke execute ... from public` fails the project's own pgTAP
    suite, with the fix in its message."""
    tests = sorted((project / "supabase/tests/database").glob("*.test.sql"))
    db.execute(
        "create function pgqueue.added_later() returns int language sql"
        " set search_path = pg_catalog, pg_temp as 'select 1'"
    )
    try:
        failed = subprocess.run(
            ["pg_prove", "-d", stack.dsn(), *tests], capture_output=True, text=True
        )
        db.execute("revoke execute on function pgqueue.added_later() from public")
        passed = subprocess.run(
            ["pg_prove", "-d", stack.dsn(), *tests], capture_output=True, text=True
        )
    finally:
        db.execute("drop function pgqueue.added_later()")
    assert failed.returncode != 0
    assert "revokes execute on it from public" in failed.stdout + failed.stderr
    assert passed.returncode == 0, passed.stdout + passed.stderr


def test_the_projects_pgtap_suite_fails_on_a_queue_function_that_leaves_pg_temp_out(
    project: Path, db: psycopg.Connection, stack: Cluster
) -> None:
    """A function a later migration adds to the queue schema with the weak `search_path = ''`
    (pg_temp left out, so searched first for tables and types: tests/sql/test_temp_shadowing.py)
    fails the project's own pgTAP suite, which names the form it wants; with pg_temp named, and
    last, it passes."""
    tests = sorted((project / "supabase/tests/database").glob("*.test.sql"))

    def add(search_path: str) -> subprocess.CompletedProcess:
        db.execute(
            "create or replace function pgqueue.added_later() returns int language sql"
            f" set search_path = {search_path} as 'select 1';"
            "revoke execute on function pgqueue.added_later() from public"
        )
        return subprocess.run(
            ["pg_prove", "-d", stack.dsn(), *tests], capture_output=True, text=True
        )

    try:
        weak, pinned = add("''"), add("pg_catalog, pg_temp")
    finally:
        db.execute("drop function pgqueue.added_later()")
    assert weak.returncode != 0
    assert "sets search_path = pg_catalog, pg_temp" in weak.stdout + weak.stderr
    assert pinned.returncode == 0, pinned.stdout + pinned.stderr


def test_the_projects_pgtap_suite_lets_only_an_inlined_helper_leave_the_path_alone(
    project: Path, db: psycopg.Connection, stack: Cluster
) -> None:
    """An internal (`_`-named) SQL function without settings may leave search_path alone (it is
    inlined into its caller, whose path is pinned); made SECURITY DEFINER, named without the
    underscore, or in PL/pgSQL, it fails the project's pgTAP suite."""
    tests = sorted((project / "supabase/tests/database").glob("*.test.sql"))

    def add(name: str, shape: str) -> subprocess.CompletedProcess:
        body = "select 1" if shape.startswith("language sql") else "begin return 1; end"
        db.execute(
            f"create function pgqueue.{name}() returns int {shape} as $${body}$$;"
            f"revoke execute on function pgqueue.{name}() from public"
        )
        try:
            return subprocess.run(
                ["pg_prove", "-d", stack.dsn(), *tests], capture_output=True, text=True
            )
        finally:
            db.execute(f"drop function pgqueue.{name}()")

    inlined = add("_added_later", "language sql")
    refused = [
        add("_added_later", "language sql security definer"),
        add("added_later", "language sql"),
        add("_added_later", "language plpgsql"),
    ]
    assert inlined.returncode == 0, inlined.stdout + inlined.stderr
    for run in refused:
        assert run.returncode != 0
        assert "sets search_path = pg_catalog, pg_temp" in run.stdout + run.stderr
