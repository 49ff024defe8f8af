"""`copier update` between template releases: the user's code and the live database both move
forward. Releases are made here the way Copier's own tests and doodba-copier-template do it:
snapshot the working tree into a git repo, tag it, and commit a second release on top."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import copier
import jinja2
import pathspec
import pytest
import yaml
from psycopg.types.json import Jsonb

from testkit.cluster import free_port
from testkit.hosted import start_hosted_cluster
from testkit.project import (
    COPIER_LOCK,
    REPO,
    baseline_migrations,
    commit_everything,
    current_baseline,
    push_migrations,
    record_prompts,
    release_refs,
    release_version,
    render,
    render_repo,
    rendered_files,
    run,
    snapshot_template,
    supabase,
    update,
)
from tests.support.releases import EMAIL, RELEASE_ANSWERS, fill_queue

# The migrations a new project's queue starts from (each table, view and function once).
BASELINE = baseline_migrations()
# What a project created at 0.1.0 gets instead: one step per release since, from 0.1.0's queue
# to 1.0.0's, from 1.0.0's to 1.1.0's, from 1.1.0's to 1.2.0's, from 1.2.0's to 1.3.0's, from
# 1.3.0's to 1.4.0's and from 1.4.0's to 1.5.0's.
STEPS = {
    "20261206000000_pgqueue_1_0_0_from_0_1_0.sql",
    "20261207000000_pgqueue_1_1_0_client_jobs.sql",
    "20261208000000_pgqueue_1_2_0_security.sql",
    "20261209000000_pgqueue_1_3_0_readable.sql",
    "20261210000000_pgqueue_1_4_0_toolkit.sql",
    "20261211000000_pgqueue_1_5_0_workflows.sql",
}
MIGRATIONS = "template/supabase/migrations"

RELEASE_B_MIGRATION = """\
-- {{ queue_schema }}: jobs remember the region they must run in.
alter table {{ queue_schema }}.jobs add column region text not null default 'eu';
create index jobs_region_idx on {{ queue_schema }}.jobs (region) where status = 'queued';
"""
USER_MIGRATION = "create table public.orders (id bigint primary key, email text not null);\n"


@contextlib.contextmanager
def run_worker(project: Path, dsn: str, **env: str) -> Iterator[subprocess.Popen]:
    """The rendered project's worker (postgres transport), on this interpreter, which has every
    dependency a variant needs; SIGTERM on the way out."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "my_app", "worker"],
        cwd=project,
        env={**os.environ, "PYTHONPATH": str(project / "src"), "DATABASE_URL": dsn, **env},
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


def wait_for_status(
    cluster, ids: list[int], status: str, worker: subprocess.Popen, schema: str = "pgqueue"
) -> None:
    deadline = time.monotonic() + 30
    with cluster.connect(autocommit=True) as db:
        while time.monotonic() < deadline:
            statuses = db.execute(
                f"select status from {schema}.all_jobs where id = any(%s)", (ids,)
            ).fetchall()
            if {s for (s,) in statuses} == {status}:
                return
            assert worker.poll() is None, worker.stdout.read() if worker.stdout else ""
            time.sleep(0.2)
    raise AssertionError(f"jobs {ids} did not reach {status}: {statuses}")


def test_copy_is_refused_without_trust_and_works_without_tasks(
    template: Path, tmp_path: Path
) -> None:
    """The update task needs --trust; a user who would rather not trust the template can copy
    with --skip-tasks (the task does nothing on copy)."""
    with COPIER_LOCK, pytest.raises(copier.errors.UnsafeTemplateError, match="tasks"):
        copier.run_copy(str(template), str(tmp_path / "refused"), defaults=True, vcs_ref="HEAD")
    with COPIER_LOCK:
        copier.run_copy(
            str(template), str(tmp_path / "app"), defaults=True, vcs_ref="HEAD", skip_tasks=True
        )
    assert all((tmp_path / "app" / "supabase/migrations" / name).exists() for name in BASELINE)


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
    commit_everything(repo, "release 1.1.0")
    run(["git", "tag", "v1.1.0"], cwd=repo)
    return repo


def test_update_keeps_user_edits_and_jobs_and_applies_the_new_migration(
    releases: Path, tmp_path: Path
) -> None:
    project = render_repo(
        releases,
        tmp_path / "app",
        "generated at 1.0.0",
        vcs_ref="v1.0.0",
        claim_transport="postgres",
    )

    # The user's own work: a handler change, notes in the README, a migration of their own.
    handler = project / "src/my_app/handlers/send_email.py"
    handler.write_text(handler.read_text().replace("(stub)", "(stub, edited by us)"))
    readme = project / "README.md"
    readme.write_text(readme.read_text() + "\n## Team notes\n\nPager: #jobs-oncall\n")
    user_migration = project / "supabase/migrations/20261215000000_orders.sql"
    user_migration.write_text(USER_MIGRATION)
    commit_everything(project, "our changes")

    cluster = start_hosted_cluster()
    try:
        push_migrations(project, cluster.url())
        with cluster.connect(autocommit=True) as db:
            # one stored as a batch, one (with a priority) as a row of pgqueue.jobs
            db.execute("select pgqueue.enqueue_many(%s)", (Jsonb([EMAIL]),))
            db.execute("select pgqueue.enqueue_many(%s)", (Jsonb([{**EMAIL, "priority": 1}]),))
            dead = db.execute("select pgqueue.enqueue('c', max_attempts => 1)").fetchone()[0]
            db.execute("select pgqueue.enqueue('d')")
            (dead_token,) = db.execute(
                "select lock_token from pgqueue.claim('w', kinds => array['c'])"
            ).fetchone()
            db.execute("select pgqueue.fail(%s, %s, 'boom')", (dead, dead_token))
            db.execute("select id from pgqueue.claim('w', kinds => array['d'])")
            before = db.execute(
                "select id, kind, status, attempts from pgqueue.all_jobs order by id"
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
        # the release's one migration added to the baseline the project started from
        assert sorted(p.name for p in (project / "supabase/migrations").iterdir()) == [
            *BASELINE,
            "20261215000000_orders.sql",
            "20270101000000_pgqueue_job_region.sql",
        ]
        assert (
            f"_queue_baseline: {current_baseline()}"
            in (project / ".copier-answers.yml").read_text()
        )
        assert "_commit: v1.1.0" in (project / ".copier-answers.yml").read_text()

        supabase(project, "migration", "up", "--db-url", cluster.url())
        with cluster.connect(autocommit=True) as db:
            after = db.execute(
                "select id, kind, status, attempts from pgqueue.all_jobs order by id"
            ).fetchall()
            assert after == before
            assert db.execute("select distinct region from pgqueue.jobs").fetchall() == [("eu",)]
            assert db.execute("select to_regclass('pgqueue.jobs_region_idx')").fetchone()[0]
        # the upgraded project's worker runs the jobs that waited through the upgrade
        queued = [job_id for job_id, _, status, _ in before if status == "queued"]
        with run_worker(project, cluster.dsn(user="postgres")) as worker:
            wait_for_status(cluster, queued, "done", worker)
        assert worker.returncode == 0, "SIGTERM ends the worker cleanly"
        with cluster.connect() as db:
            states = dict(db.execute("select id, status from pgqueue.all_jobs").fetchall())
        assert [states[r[0]] for r in before] == ["done", "done", "failed", "running"]
    finally:
        cluster.destroy()


def test_update_to_another_transport_renders_the_new_variant(
    template: Path, tmp_path: Path
) -> None:
    project = render_repo(template, tmp_path / "app", "generated with the supabase transport")
    assert (project / "src/my_app/queue/supabase_transport.py").exists()
    update(project, "HEAD", claim_transport="postgres")
    assert not (project / "src/my_app/queue/supabase_transport.py").exists()
    assert (project / "src/my_app/queue/postgres_transport.py").exists()
    pyproject = (project / "pyproject.toml").read_text()
    assert "psycopg" in pyproject and '"supabase' not in pyproject
    assert "claim_transport: postgres" in (project / ".copier-answers.yml").read_text()
    assert not [p for p in rendered_files(project) if p.suffix == ".rej"]
    run(["ruff", "check", "."], cwd=project)
    run(["ruff", "format", "--check", "."], cwd=project)


WAKE_UP_DEFAULTS = {
    "worker_url_setting": "app.pgqueue_worker_url",
    "service_key_setting": "app.pgqueue_wake_secret",
}


def config_changes(project: Path, generated: set[Path]) -> dict:
    """What the migration the update task added configures (its marker line)."""
    (added,) = set((project / MIGRATIONS_DIR).iterdir()) - generated
    marker = "-- pgqueue-template config: "
    (line,) = [x for x in added.read_text().splitlines() if x.startswith(marker)]
    return json.loads(line.removeprefix(marker))


def test_switching_to_a_style_the_database_posts_to_asks_the_wake_up_questions(
    template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A python project is not asked where wake-ups go; switched to python-http, it is asked
    just that (the other answers kept), and the database gets the new URL."""
    project = render_repo(template, tmp_path / "app", "generated polling")
    assert not WAKE_UP_DEFAULTS.keys() & recorded_answers(project).keys()
    generated = set((project / MIGRATIONS_DIR).iterdir())
    asked = record_prompts(monkeypatch)
    with COPIER_LOCK:
        copier.run_update(
            str(project),
            data={"worker_style": "python-http"},
            skip_answered=True,
            overwrite=True,
            unsafe=True,
            vcs_ref="HEAD",
            quiet=True,
            conflict="rej",
        )
    assert sorted(asked) == ["service_key_setting", "worker_url", "worker_url_setting"]
    assert (project / "src/my_app/worker/app.py").exists(), "the HTTP worker"
    assert not [p for p in rendered_files(project) if p.suffix == ".rej"]
    url = "http://host.docker.internal:8000/wake"
    assert recorded_answers(project) | WAKE_UP_DEFAULTS == recorded_answers(project)
    assert recorded_answers(project)["worker_url"] == url
    assert config_changes(project, generated) == {"worker_url": url}


def test_switching_to_the_python_style_gives_the_wake_up_answers_their_defaults(
    template: Path, tmp_path: Path
) -> None:
    """Back to a worker that LISTENs or polls: the database stops POSTing (no URL), and the
    setting names are a new python project's."""
    project = render_repo(
        template, tmp_path / "app", "generated", **RELEASE_ANSWERS["python-http-custom"]
    )
    generated = set((project / MIGRATIONS_DIR).iterdir())
    update(project, "HEAD", worker_style="python")
    assert not (project / "src/my_app/worker/app.py").exists()
    assert not [p for p in rendered_files(project) if p.suffix == ".rej"]
    assert not WAKE_UP_DEFAULTS.keys() & recorded_answers(project).keys()
    assert "worker_url" not in recorded_answers(project)
    assert config_changes(project, generated) == {"worker_url": ""} | WAKE_UP_DEFAULTS


def copier_cli(*args: str | Path, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    """Copier's command line as a user runs it (not quiet), its output captured; a failure
    raises unless `check` is false (the test then reads what Copier said)."""
    return subprocess.run(
        [sys.executable, "-m", "copier", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=check,
        env={**os.environ, "NO_COLOR": "1"},
    )


def test_copy_and_update_from_a_release_print_no_warning(releases: Path, tmp_path: Path) -> None:
    copy = copier_cli(
        "copy", "--trust", "--defaults", releases, "app", "--vcs-ref", "v1.0.0", cwd=tmp_path
    )
    project = tmp_path / "app"
    said = [line for line in copy.stderr.splitlines() if line.strip()]
    assert said[0] == "Copying from template version 1.0.0", copy.stderr
    assert not [line for line in said if "warn" in line.lower() or "tags" in line], copy.stderr
    run(["git", "init", "-q", "-b", "main"], cwd=project)
    commit_everything(project, "generated")

    updated = copier_cli("update", "--trust", "--defaults", cwd=project)
    said = [line for line in updated.stderr.splitlines() if line.strip()]
    # Copier names each migration it runs (README.md says what they are); nothing else
    assert said[0] == "Updating to template version 1.1.0", updated.stderr
    assert [line.split(":")[0] for line in said[1:]] == [
        " > Running task 1 of 2",
        " > Running task 2 of 2",
    ], said
    assert "unreleased_migrations.py" in said[1]
    assert "report_conflicts.py" in said[2]
    assert "_commit: v1.1.0" in (project / ".copier-answers.yml").read_text()


def test_a_copy_from_a_relative_path_says_how_to_update_and_the_fix_works(
    releases: Path, tmp_path: Path
) -> None:
    copy = copier_cli("copy", "--trust", "--defaults", releases.name, "app", cwd=releases.parent)
    project = releases.parent / "app"
    assert 'records the template as "template", a path\nrelative' in copy.stderr
    run(["git", "init", "-q", "-b", "main"], cwd=project)
    commit_everything(project, "generated")
    # what the note and the README warn of: from inside the project, Copier does not find it
    refused = copier_cli("update", "--trust", "--defaults", cwd=project, check=False)
    assert refused.returncode != 0
    assert "Updating is only supported in git-tracked templates." in refused.stderr
    # the fix they give: the template's absolute path in _src_path, committed
    answers = project / ".copier-answers.yml"
    answers.write_text(answers.read_text().replace("_src_path: template", f"_src_path: {releases}"))
    commit_everything(project, "the template by its absolute path")
    copier_cli("update", "--trust", "--defaults", cwd=project)
    assert "_commit: v1.1.0" in answers.read_text()


@pytest.mark.parametrize("conflict", ["inline", "rej"])
def test_an_update_with_conflicts_names_the_files_left_to_resolve(
    releases: Path, tmp_path: Path, conflict: str, capfd: pytest.CaptureFixture
) -> None:
    project = render_repo(releases, tmp_path / "app", "generated at 1.0.0", vcs_ref="v1.0.0")
    config = project / "supabase/config.toml"
    config.write_text(config.read_text() + "\n# our own last line\n")  # where 1.1.0 adds one
    commit_everything(project, "our config")
    capfd.readouterr()
    with COPIER_LOCK:
        copier.run_update(
            str(project),
            defaults=True,
            overwrite=True,
            unsafe=True,
            vcs_ref="v1.1.0",
            quiet=True,
            conflict=conflict,
        )
    err = capfd.readouterr().err
    if conflict == "inline":
        assert "<<<<<<< before updating" in config.read_text()
        assert "left conflict markers in 1 file:\n  supabase/config.toml\n" in err, err
    else:
        assert (project / "supabase/config.toml.rej").exists()
        assert "could not apply 1 change, kept in:\n  supabase/config.toml.rej\n" in err, err
    assert "README.md (Taking template releases)" in err


# --- The release rule, and updates from the release on a live database ---------------------

RELEASES = release_refs()
# 0.1.0: the release whose projects 1.0.0's step migration updates
FIRST_RELEASE = RELEASES[0]
MIGRATIONS_DIR = "supabase/migrations"


def render_at(template: Path, ref: str, dest: Path, answers: dict) -> Path:
    return render(template, dest, vcs_ref=ref, **answers)


def recorded_answers(project: Path) -> dict:
    """The answers a project recorded in .copier-answers.yml: what `copier update` renders the
    new release with (a default that changed since does not reach an existing project)."""
    recorded = yaml.safe_load((project / ".copier-answers.yml").read_text())
    return {k: v for k, v in recorded.items() if not k.startswith("_")}


def released_migration_changes(release: Path, head: Path) -> list[str]:
    """The release render's migrations that HEAD's render (same answers) lacks or renders
    differently, byte for byte."""
    problems = []
    for old in sorted((release / MIGRATIONS_DIR).glob("*.sql")):
        new = head / MIGRATIONS_DIR / old.name
        if not new.exists():
            problems.append(f"{old.name}: released, missing at HEAD")
        elif new.read_bytes() != old.read_bytes():
            problems.append(f"{old.name}: released, rendered differently at HEAD")
    return problems


def test_update_excludes_every_baseline_migration_and_no_step() -> None:
    """copier.yml's `_exclude` on update: every release's baseline files (a project keeps the
    ones it was created with), never a step a project updated from a release must get."""
    patterns = yaml.safe_load((REPO / "copier.yml").read_text())["_exclude"]
    rendered = [jinja2.Template(p).render(_copier_operation="update") for p in patterns]
    # the pattern style copier itself uses
    style = "gitignore" if int(pathspec.__version__.split(".")[0]) >= 1 else "gitwildmatch"
    spec = pathspec.PathSpec.from_lines(style, [p for p in rendered if p])
    names = re.compile(r"^\{% if queue_baseline == [^%]+%\}(?P<name>.+)\{% endif")
    found = {m["name"] for p in (REPO / MIGRATIONS).iterdir() if (m := names.match(p.name))}
    baselines = found - STEPS
    # 0.1.0's four files, 1.0.0's, 1.1.0's and 1.2.0's one, 1.3.0's and 1.4.0's ten, and the
    # current one's
    assert len(baselines) == 4 + 1 + 1 + 1 + 10 + 10 + len(BASELINE), sorted(baselines)
    migrations = "supabase/migrations/"
    assert [b for b in sorted(baselines) if not spec.match_file(migrations + b)] == []
    assert [s for s in sorted(STEPS) if spec.match_file(migrations + s)] == []


@pytest.mark.parametrize("ref", RELEASES)
@pytest.mark.parametrize("answers", RELEASE_ANSWERS.values(), ids=RELEASE_ANSWERS)
def test_released_migrations_render_byte_identical_at_head(
    history: Path, tmp_path: Path, ref: str, answers: dict
) -> None:
    release = render_at(history, ref, tmp_path / "release", answers)
    # HEAD as it renders for a project created at that release (copier update does the same)
    baseline = {"queue_baseline": release_version(ref)}
    head = render_at(history, "HEAD", tmp_path / "head", recorded_answers(release) | baseline)
    assert list((release / MIGRATIONS_DIR).glob("*.sql")), f"{ref} rendered no migration"
    assert released_migration_changes(release, head) == []


def test_the_release_rule_fails_when_a_released_migration_is_edited(
    history: Path, tmp_path: Path
) -> None:
    release = render_at(history, FIRST_RELEASE, tmp_path / "release", {})
    released = sorted((release / MIGRATIONS_DIR).glob("*.sql"))
    edited = snapshot_template(tmp_path / "edited")
    sources = edited / "template" / MIGRATIONS_DIR
    # a change no reader would notice: one more space in the first released migration
    (first,) = sources.glob(f"*{released[0].name}*")
    first.write_text(first.read_text().replace("create table", "create  table", 1))
    (last,) = sources.glob(f"*{released[-1].name}*")
    last.unlink()
    commit_everything(edited, "edit released migrations")
    baseline = {"queue_baseline": release_version(FIRST_RELEASE)}
    head = render_at(edited, "HEAD", tmp_path / "head", recorded_answers(release) | baseline)
    assert released_migration_changes(release, head) == [
        f"{released[0].name}: released, rendered differently at HEAD",
        f"{released[-1].name}: released, missing at HEAD",
    ]


def expected_config(answers: dict) -> dict:
    return {
        "max_attempts": answers["max_attempts"],
        "lease_seconds": answers["lease_seconds"],
        "retention_days": answers["retention_days"],
        "dead_letter_retention_days": answers["retention_days"] * 4,
        # not asked of the python style, which gets the defaults
        "worker_url": answers.get("worker_url") or None,
        "worker_url_setting": answers.get("worker_url_setting", "app.pgqueue_worker_url"),
        "service_key_setting": answers.get("service_key_setting", "app.pgqueue_wake_secret"),
        "sweep_schedule": answers["sweep_schedule"],
        # a NOTIFY only where workers LISTEN: the postgres transport's
        "notify_listeners": answers["worker_style"] != "edge"
        and answers.get("claim_transport") == "postgres",
        # every worker but an Edge Function looks for jobs when no wake-up comes
        "workers_poll": answers["worker_style"] != "edge",
    }


def assert_database_follows_answers(db, project: Path) -> None:
    """The configuration, the sweeper's schedule and what new jobs and claims get all match
    the project's answers."""
    answers = yaml.safe_load((project / ".copier-answers.yml").read_text())
    schema = answers["queue_schema"]
    (config,) = db.execute(f"select {schema}.configure()").fetchone()
    expected = expected_config(answers)
    assert {k: config[k] for k in expected} == expected
    (schedule,) = db.execute(
        "select schedule from cron.job where jobname = %s", (f"{schema}-sweep",)
    ).fetchone()
    assert schedule == answers["sweep_schedule"]
    (enqueued,) = db.execute(f"select {schema}.enqueue('config-probe')").fetchone()
    (inserted,) = db.execute(
        f"insert into {schema}.jobs (kind) values ('config-probe') returning id"
    ).fetchone()
    attempts = db.execute(
        f"select max_attempts from {schema}.jobs where id in (%s, %s)", (enqueued, inserted)
    ).fetchall()
    assert attempts == [(answers["max_attempts"],)] * 2
    (lease,) = db.execute(
        f"select extract(epoch from locked_until - locked_at)::integer"
        f" from {schema}.claim('probe', 2, kinds => array['config-probe'])"
    ).fetchall()[0]
    assert lease == answers["lease_seconds"]
    db.execute(f"delete from {schema}.jobs where kind = 'config-probe'")


# (answers at the release, answers changed by the update)
UPGRADES = {
    "defaults-answers-changed": (
        {},
        {
            "worker_style": "python-http",  # which the database POSTs to: asked its URL
            "claim_transport": "postgres",
            "max_attempts": 8,
            "lease_seconds": 900,
            "retention_days": 10,
            "sweep_schedule": "*/2 * * * *",
            "worker_url": "http://127.0.0.1:9/wake",
            "service_key_setting": "app.wake_key",
        },
    ),
    "python-postgres-custom-unchanged": (RELEASE_ANSWERS["python-postgres-custom"], {}),
    "python-http-custom-answers-changed": (
        RELEASE_ANSWERS["python-http-custom"],
        {"worker_url": "", "lease_seconds": 30, "worker_url_setting": "app.other_url"},
    ),
}


@pytest.mark.parametrize(("at_release", "changes"), UPGRADES.values(), ids=UPGRADES)
def test_a_project_from_the_release_updates_to_head_with_its_live_jobs(
    history: Path, tmp_path: Path, at_release: dict, changes: dict, capfd: pytest.CaptureFixture
) -> None:
    project = render_repo(
        history, tmp_path / "app", "generated at 0.1.0", vcs_ref=FIRST_RELEASE, **at_release
    )
    released = {p.name: p.read_bytes() for p in (project / MIGRATIONS_DIR).glob("*.sql")}
    schema = at_release.get("queue_schema", "pgqueue")

    cluster = start_hosted_cluster()
    try:
        push_migrations(project, cluster.url())
        with cluster.connect(autocommit=True) as db:
            db.execute("update cron.job set active = false")
            ids = fill_queue(db, schema)
            before = db.execute(
                f"select id, kind, status, attempts, max_attempts from {schema}.jobs order by id"
            ).fetchall()

        capfd.readouterr()
        update(project, "HEAD", **changes)
        # the update task runs in the project only: not in Copier's scratch render of the new
        # release, which holds no queue migration and would say the configuration is missing
        assert "seeds the queue's configuration" not in capfd.readouterr().err
        files = rendered_files(project)
        assert not [p for p in files if p.suffix == ".rej"]
        for name, content in released.items():
            assert (project / MIGRATIONS_DIR / name).read_bytes() == content, name
        # one migration per release since, never the baseline of a new project
        added = {p.name for p in (project / MIGRATIONS_DIR).glob("*.sql")} - set(released)
        assert {n for n in added if not n.endswith("_pgqueue_config.sql")} == STEPS
        assert "_queue_baseline: 0.1.0" in (project / ".copier-answers.yml").read_text()
        supabase(project, "migration", "up", "--db-url", cluster.url())

        with cluster.connect(autocommit=True) as db:
            # finished jobs moved to the history (all_jobs shows both), with their states
            after = db.execute(
                f"select id, kind, status, attempts, max_attempts from {schema}.all_jobs"
                " order by id"
            ).fetchall()
            assert after == before
            live = db.execute(f"select status from {schema}.live_jobs").fetchall()
            assert {status for (status,) in live} == {"queued", "running"}
            # the running job's worker still holds it, under the token of its claim
            (running,), (token,) = ids["running"], ids["running_token"]
            assert db.execute(
                f"select {schema}.heartbeat(%s, %s)", (running, token)
            ).fetchone() == (True,)
            for state in ("running", "failed", "done"):
                again = db.execute(
                    f"select {schema}.enqueue(%s, idempotency_key => %s)",
                    (state, f"release-{state}"),
                ).fetchone()
                assert again == (ids[state][0],), f"the {state} job still holds its key"
            assert_database_follows_answers(db, project)

        # the updated project's worker drains the jobs that waited through the upgrade
        env = {
            "SUPABASE_SERVICE_ROLE_KEY": "not-used-here",
            "WAKE_SECRET": "0123456789abcdef" * 4,  # as `openssl rand -hex 32` makes one
            "PORT": str(free_port()),
        }
        with run_worker(project, cluster.dsn(user="postgres"), **env) as worker:
            wait_for_status(cluster, ids["queued"], "done", worker, schema)
        assert worker.returncode == 0, "SIGTERM ends the worker cleanly"
        with cluster.connect() as db:
            states = dict(db.execute(f"select id, status from {schema}.all_jobs").fetchall())
        assert [states[i] for s in ("running", "failed", "done") for i in ids[s]] == [
            "running",
            "failed",
            "done",
        ]
    finally:
        cluster.destroy()


def test_each_answer_change_adds_one_migration_that_changes_only_that_answer(
    template: Path, tmp_path: Path
) -> None:
    project = render_repo(template, tmp_path / "app", "generated")
    cluster = start_hosted_cluster()
    try:
        push_migrations(project, cluster.url())
        with cluster.connect(autocommit=True) as db:
            # changed at run time; no answer changes it, so no update may undo it
            db.execute("""select pgqueue.configure('{"retention_days": 2}')""")

        generated = set((project / MIGRATIONS_DIR).iterdir())
        update(project, "HEAD", lease_seconds=600)
        (added,) = set((project / MIGRATIONS_DIR).iterdir()) - generated
        assert added.name.endswith("_pgqueue_config.sql")
        assert '"lease_seconds": 600' in added.read_text()
        assert "retention_days" not in added.read_text()
        commit_everything(project, "lease 600")
        update(project, "HEAD", lease_seconds=600)
        assert run(["git", "status", "--porcelain"], cwd=project) == "", "nothing changed"

        # a migration of the user's dated later than now: the next one comes after it
        user = project / MIGRATIONS_DIR / "20991231000000_orders.sql"
        user.write_text(USER_MIGRATION)
        commit_everything(project, "our migration")
        update(
            project,
            "HEAD",
            max_attempts=3,
            sweep_schedule="*/10 * * * *",
            claim_transport="postgres",  # whose workers LISTEN: NOTIFY on
        )
        assert (project / MIGRATIONS_DIR / "20991231000001_pgqueue_config.sql").exists()

        supabase(project, "migration", "up", "--db-url", cluster.url())
        with cluster.connect(autocommit=True) as db:
            (config,) = db.execute("select pgqueue.configure()").fetchone()
            assert (config["lease_seconds"], config["max_attempts"]) == (600, 3)
            assert config["retention_days"] == 2
            assert config["sweep_schedule"] == "*/10 * * * *"
            assert config["notify_listeners"] is True
            assert db.execute(
                "select schedule from cron.job where jobname = 'pgqueue-sweep'"
            ).fetchone() == ("*/10 * * * *",)
    finally:
        cluster.destroy()


@pytest.mark.parametrize(
    ("answer", "value", "message"),
    [
        ("queue_schema", "jobs", 'The queue schema cannot change on update: .* in "pgqueue"'),
        ("package_name", "renamed", "The package name cannot change on update: .*src/my_app"),
    ],
)
def test_answers_that_cannot_change_on_update_are_refused(
    template: Path, tmp_path: Path, answer: str, value: str, message: str
) -> None:
    project = render_repo(template, tmp_path / "app", "generated")
    with pytest.raises(ValueError, match=message) as refused:
        update(project, "HEAD", **{answer: value})
    assert run(["git", "status", "--porcelain"], cwd=project) == "", "nothing was written"
    # the page it names is a full URL (docs/ is the template's, not in the project), and the
    # section it names is on that page
    (page, section) = re.findall(
        r"https://github.com/org/pgqueue-template/blob/main/(\S+\.md)#([a-z-]+)", str(refused.value)
    )[0]
    headings = re.findall(r"^#+ (.+)$", (REPO / page).read_text(), re.M)
    assert section in {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in headings}


def test_a_project_made_after_the_newest_release_is_refused_a_downgrade_and_told_apart(
    releases: Path, tmp_path: Path
) -> None:
    """docs/upgrading.md: a copy of a commit after the newest release is ahead of it, so
    `copier update --defaults` (the newest tag) is refused as a downgrade, changing nothing;
    `--vcs-ref HEAD` updates it."""
    readme = releases / "template/README.md.jinja"
    readme.write_text(readme.read_text() + "\nA line after release 1.1.0.\n")
    commit_everything(releases, "after 1.1.0")
    copy = copier_cli(
        "copy", "--trust", "--defaults", releases, "app", "--vcs-ref", "HEAD", cwd=tmp_path
    )
    project = tmp_path / "app"
    assert "Copying from template version 1.1.0.post1.dev0+" in copy.stderr, copy.stderr
    run(["git", "init", "-q", "-b", "main"], cwd=project)
    commit_everything(project, "generated")
    answers = (project / ".copier-answers.yml").read_text()

    refused = copier_cli("update", "--trust", "--defaults", cwd=project, check=False)
    assert refused.returncode != 0
    assert "You are downgrading from 1.1.0.post1.dev0+" in refused.stderr, refused.stderr
    assert "to 1.1.0. Downgrades are not supported." in refused.stderr, refused.stderr
    assert (project / ".copier-answers.yml").read_text() == answers
    assert run(["git", "status", "--porcelain"], cwd=project) == ""

    copier_cli("update", "--trust", "--defaults", "--vcs-ref", "HEAD", cwd=project)
    assert "A line after release 1.1.0." in (project / "README.md").read_text()
