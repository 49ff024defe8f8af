"""`copier update` between template releases: the user's code and the live database both move
forward. Releases are made here the way Copier's own tests and doodba-copier-template do it:
snapshot the working tree into a git repo, tag it, and commit a second release on top."""

from __future__ import annotations

import subprocess
from pathlib import Path

import copier
import pytest

from tests.support.project import (
    REPO,
    push_migrations,
    rendered_files,
    run,
    snapshot_template,
    supabase,
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
        str(releases), str(project), defaults=True, vcs_ref="v1.0.0", unsafe=True, quiet=True
    )
    run(["git", "init", "-q", "-b", "main"], cwd=project)
    commit_all(project, "generated at 1.0.0")

    # The user's own work: notes in the README and a domain migration of their own.
    readme = project / "README.md"
    readme.write_text(readme.read_text() + "\n## Team notes\n\nPager: #jobs-oncall\n")
    user_migration = project / "supabase/migrations/20261215000000_orders.sql"
    user_migration.write_text(USER_MIGRATION)
    commit_all(project, "our changes")

    cluster = start_supabase_like_cluster()
    try:
        push_migrations(project, cluster.url())
        with cluster.connect(autocommit=True) as db:
            db.execute("select pgqueue.enqueue_many(%s)", ('[{"kind":"a"},{"kind":"b"}]',))
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

        copier.run_update(
            str(project),
            defaults=True,
            overwrite=True,
            unsafe=True,
            vcs_ref="v1.1.0",
            quiet=True,
            conflict="rej",
        )

        files = rendered_files(project)
        assert not [p for p in files if p.suffix == ".rej"]
        assert not [
            p for p in files if "<<<<<<<" in p.read_text(errors="replace") and p.suffix != ".rej"
        ]
        assert "Pager: #jobs-oncall" in readme.read_text()
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
            # the queue still works end to end on the upgraded schema
            claimed = db.execute("select id, lock_token from pgqueue.claim('w2', 10)").fetchall()
            assert sorted(r[0] for r in claimed) == [r[0] for r in before if r[2] == "queued"]
            done = db.execute(
                "select pgqueue.complete_many(%s, %s)",
                ([r[0] for r in claimed], [r[1] for r in claimed]),
            ).fetchall()
            assert len(done) == len(claimed)
    finally:
        cluster.destroy()


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
    copier.run_update(
        str(project), defaults=True, overwrite=True, unsafe=True, vcs_ref="HEAD", conflict="rej"
    )
    assert not [p for p in rendered_files(project) if p.suffix == ".rej"]
