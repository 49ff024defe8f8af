"""`copier update` between template releases: the user's code and the live database both move
forward. Releases are made here the way Copier's own tests and doodba-copier-template do it:
snapshot the working tree into a git repo, tag it, and commit a second release on top."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import copier
import pytest
from psycopg.types.json import Jsonb

from tests.support.project import (
    REPO,
    push_migrations,
    render,
    rendered_files,
    run,
    snapshot_template,
    supabase,
    update,
)
from tests.support.stack import start_supabase_like_cluster

GIT = ["git", "-c", "user.name=test", "-c", "user.email=test@example.com"]
MIGRATIONS = "template/supabase/migrations"

RELEASE_B_MIGRATION = """\
-- {{ queue_schema }}: jobs remember the region they must run in.
alter table {{ queue_schema }}.jobs add column region text not null default 'eu';
create index jobs_region_idx on {{ queue_schema }}.jobs (region) where status = 'queued';
"""
USER_MIGRATION = "create table public.orders (id bigint primary key, email text not null);\n"


EMAIL = {"kind": "send_email", "payload": {"to": "a@example.com", "subject": "s", "text": "t"}}


@contextlib.contextmanager
def run_worker(project: Path, dsn: str) -> Iterator[subprocess.Popen]:
    """The rendered project's worker (postgres transport), on this interpreter, which has every
    dependency a variant needs; SIGTERM on the way out."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "my_app", "worker"],
        cwd=project,
        env={**os.environ, "PYTHONPATH": str(project / "src"), "DATABASE_URL": dsn},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_for_status(cluster, ids: list[int], status: str, worker: subprocess.Popen) -> None:
    deadline = time.monotonic() + 30
    with cluster.connect(autocommit=True) as db:
        while time.monotonic() < deadline:
            statuses = db.execute(
                "select status from pgqueue.jobs where id = any(%s)", (ids,)
            ).fetchall()
            if {s for (s,) in statuses} == {status}:
                return
            assert worker.poll() is None, worker.stdout.read() if worker.stdout else ""
            time.sleep(0.2)
    raise AssertionError(f"jobs {ids} did not reach {status}: {statuses}")


def commit_all(repo: Path, message: str, tag: str | None = None) -> None:
    run([*GIT, "add", "-A"], cwd=repo)
    run([*GIT, "commit", "-q", "-m", message], cwd=repo)
    if tag:
        run([*GIT, "tag", tag], cwd=repo)


def released_migration_changes(repo: Path) -> list[str]:
    """Migrations that exist in a release tag but were changed or removed since."""
    tags = run(["git", "tag", "--list", "v*"], cwd=repo).split()
    problems = []
    for tag in tags:
        names = run(["git", "ls-tree", "--name-only", f"{tag}:{MIGRATIONS}"], cwd=repo).split()
        for name in names:
            path = f"{MIGRATIONS}/{name}"
            released = run(["git", "show", f"{tag}:{path}"], cwd=repo)
            current = repo / path
            if not current.exists():
                problems.append(f"{path}: released in {tag}, since removed")
            elif current.read_text() != released:
                problems.append(f"{path}: released in {tag}, since changed")
    return problems


def test_no_released_migration_was_ever_changed() -> None:
    """The rule for this repo: schema changes ship as new migrations."""
    assert released_migration_changes(REPO) == []


def test_the_release_rule_catches_an_edited_migration(tmp_path: Path) -> None:
    repo = snapshot_template(tmp_path / "tpl")
    run(["git", "tag", "v1.0.0"], cwd=repo)
    assert released_migration_changes(repo) == []
    first = sorted((repo / MIGRATIONS).iterdir())[0]
    first.write_text(first.read_text() + "\n-- edited after release\n")
    last = sorted((repo / MIGRATIONS).iterdir())[-1]
    last.unlink()
    problems = released_migration_changes(repo)
    assert problems == [
        f"{MIGRATIONS}/{first.name}: released in v1.0.0, since changed",
        f"{MIGRATIONS}/{last.name}: released in v1.0.0, since removed",
    ]


def test_copy_without_trust_gives_a_working_project(template: Path, tmp_path: Path) -> None:
    copier.run_copy(str(template), str(tmp_path / "app"), defaults=True, vcs_ref="HEAD", quiet=True)
    assert len(list((tmp_path / "app" / "supabase" / "migrations").glob("*.sql"))) == 4


@pytest.fixture
def releases(tmp_path: Path) -> Path:
    """A template repo with release v1.0.0 (what is on disk) and v1.1.0 on top of it: a new
    migration, and a change to a file users do not edit."""
    repo = snapshot_template(tmp_path / "template")
    run(["git", "tag", "v1.0.0"], cwd=repo)
    (repo / MIGRATIONS / "20270101000000_pgqueue_job_region.sql.jinja").write_text(
        RELEASE_B_MIGRATION
    )
    config = repo / "template/supabase/config.toml.jinja"
    config.write_text(config.read_text() + "\n# release 1.1.0 was here\n")
    commit_all(repo, "release 1.1.0", tag="v1.1.0")
    return repo


def test_update_keeps_user_edits_and_jobs_and_applies_the_new_migration(
    releases: Path, tmp_path: Path
) -> None:
    project = tmp_path / "app"
    copier.run_copy(
        str(releases),
        str(project),
        data={"claim_transport": "postgres"},
        defaults=True,
        vcs_ref="v1.0.0",
        unsafe=True,
        quiet=True,
    )
    run(["git", "init", "-q", "-b", "main"], cwd=project)
    commit_all(project, "generated at 1.0.0")

    # The user's own work: a handler change, notes in the README, a migration of their own.
    handler = project / "src/my_app/handlers/send_email.py"
    handler.write_text(handler.read_text().replace("(stub)", "(stub, edited by us)"))
    readme = project / "README.md"
    readme.write_text(readme.read_text() + "\n## Team notes\n\nPager: #jobs-oncall\n")
    user_migration = project / "supabase/migrations/20261215000000_orders.sql"
    user_migration.write_text(USER_MIGRATION)
    commit_all(project, "our changes")

    cluster = start_supabase_like_cluster()
    try:
        push_migrations(project, cluster.url())
        with cluster.connect(autocommit=True) as db:
            db.execute("select pgqueue.enqueue_many(%s)", (Jsonb([EMAIL, EMAIL]),))
            dead = db.execute("select pgqueue.enqueue('c', max_attempts => 1)").fetchone()[0]
            db.execute("select pgqueue.enqueue('d')")
            (dead_token,) = db.execute(
                "select lock_token from pgqueue.claim('w', kinds => array['c'])"
            ).fetchone()
            db.execute("select pgqueue.fail(%s, %s, 'boom')", (dead, dead_token))
            db.execute("select id from pgqueue.claim('w', kinds => array['d'])")
            before = db.execute(
                "select id, kind, status, attempts from pgqueue.jobs order by id"
            ).fetchall()
        assert [row[2] for row in before] == ["queued", "queued", "failed", "running"]

        update(project, "v1.1.0")

        files = rendered_files(project)
        assert not [p for p in files if p.suffix == ".rej"]
        assert not [
            p for p in files if "<<<<<<<" in p.read_text(errors="replace") and p.suffix != ".rej"
        ]
        assert "Pager: #jobs-oncall" in readme.read_text()
        assert "(stub, edited by us)" in handler.read_text()
        assert user_migration.read_text() == USER_MIGRATION
        assert "# release 1.1.0 was here" in (project / "supabase/config.toml").read_text()
        assert (project / "supabase/migrations/20270101000000_pgqueue_job_region.sql").exists()
        assert "_commit: v1.1.0" in (project / ".copier-answers.yml").read_text()

        supabase(project, "migration", "up", "--db-url", cluster.url())
        with cluster.connect(autocommit=True) as db:
            after = db.execute(
                "select id, kind, status, attempts from pgqueue.jobs order by id"
            ).fetchall()
            assert after == before
            assert db.execute("select distinct region from pgqueue.jobs").fetchall() == [("eu",)]
            assert db.execute("select to_regclass('pgqueue.jobs_region_idx')").fetchone()[0]
        # the upgraded project's worker runs the jobs that waited through the upgrade
        queued = [job_id for job_id, _, status, _ in before if status == "queued"]
        with run_worker(project, cluster.dsn()) as worker:
            wait_for_status(cluster, queued, "done", worker)
        assert worker.returncode == 0, "SIGTERM ends the worker cleanly"
        with cluster.connect() as db:
            states = dict(db.execute("select id, status from pgqueue.jobs").fetchall())
        assert [states[r[0]] for r in before] == ["done", "done", "failed", "running"]
    finally:
        cluster.destroy()


def test_update_to_another_transport_renders_the_new_variant(
    template: Path, tmp_path: Path
) -> None:
    project = render(template, tmp_path / "app")
    assert (project / "src/my_app/supabase_transport.py").exists()
    run(["git", "init", "-q", "-b", "main"], cwd=project)
    commit_all(project, "generated with the supabase transport")
    update(project, "HEAD", claim_transport="postgres")
    assert not (project / "src/my_app/supabase_transport.py").exists()
    assert (project / "src/my_app/postgres_transport.py").exists()
    pyproject = (project / "pyproject.toml").read_text()
    assert "psycopg" in pyproject and '"supabase' not in pyproject
    assert "claim_transport: postgres" in (project / ".copier-answers.yml").read_text()
    assert not [p for p in rendered_files(project) if p.suffix == ".rej"]
    run(["ruff", "check", "."], cwd=project)
    run(["ruff", "format", "--check", "."], cwd=project)


def test_latest_release_tag_updates_to_head(tmp_path: Path) -> None:
    """Once this repo has a release tag, a project generated from it updates to HEAD."""
    tags = subprocess.run(
        ["git", "tag", "--list", "v*", "--sort=-v:refname"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    if not tags:
        assert released_migration_changes(REPO) == []
        return
    project = tmp_path / "app"
    copier.run_copy(str(REPO), str(project), defaults=True, vcs_ref=tags[0], unsafe=True)
    run(["git", "init", "-q", "-b", "main"], cwd=project)
    commit_all(project, f"generated at {tags[0]}")
    update(project, "HEAD")
    assert not [p for p in rendered_files(project) if p.suffix == ".rej"]
