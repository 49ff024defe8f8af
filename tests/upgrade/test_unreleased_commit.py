"""`copier update` of a project made from a template commit that is not a release
(hooks/unreleased_migrations.py; docs/upgrading.md, "Updating a project made from a commit that
is not a release"). A project copied at 202d53d, between 1.0.0 and 1.1.0, holds that commit's
text of `..._pgqueue_1_1_0.sql`, without the `checkout()`, `take_rows()` and `claim_fronts` that
release 1.1.0 has under the same name. The update repairs it with a new migration, and the
queue then equals a new project's; a difference that cannot be repaired in place refuses the
update, changing nothing. Tried as a user does: Copier's command line, git, the Supabase CLI."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.hosted import start_hosted_cluster
from testkit.project import (
    RELEASES,
    REPO,
    baseline_migrations,
    commit_everything,
    current_baseline,
    push_migrations,
    run,
    snapshot_with_history,
    supabase,
)
from tests.support.releases import RELEASE_ANSWERS, fill_queue
from tests.support.schema import differences, queue_schema

MIGRATIONS = "supabase/migrations"
# between 1.0.0 and 1.1.0: release 1.1.0's baseline, before checkout(), take_rows() and the
# published claim fronts
DEVELOPMENT_COMMIT = "202d53d"
STALE = "20261207000000_pgqueue_1_1_0.sql"
REPAIR = "20261207000001_pgqueue_repair.sql"
# what 1.1.0 added after that commit, which its workers call or the claim reads
ADDED_AFTER = ("checkout(text)", "take_rows(text,text,integer,text[],integer)")
# the newest release (the tests tag the releases as they are, and HEAD comes after it)
NEWEST = list(RELEASES)[-1]
# the step of a release after the newest, as template/ names it: rendered for its projects
STEP_FROM_NEWEST = re.compile(
    r"^\{% if queue_baseline in \[[^\]]*'"
    + re.escape(NEWEST)
    + r"'[^\]]*\] %\}(?P<name>.+)\{% endif"
)

spec = importlib.util.spec_from_file_location(
    "unreleased_migrations",
    Path(__file__).resolve().parents[2] / "hooks/unreleased_migrations.py",
)
hook = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hook)


def copier(*args: str | Path, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    """Copier's command line as a user runs it, its output captured."""
    done = subprocess.run(
        [sys.executable, "-m", "copier", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert not check or done.returncode == 0, done.stderr
    return done


def said(done: subprocess.CompletedProcess) -> list[str]:
    """What the template's hooks told the user (Copier's own lines left out)."""
    return [line for line in done.stderr.splitlines() if line.startswith("pgqueue-template")]


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The template as users clone it: the releases tagged (v1.0.0 to the newest; v1.3.0 was the
    first with the check), the working tree on top, and one commit after it as HEAD."""
    repo = snapshot_with_history(tmp_path_factory.mktemp("history") / "template")
    for version, commit in RELEASES.items():
        if version != "0.1.0":
            run(["git", "tag", "-f", f"v{version}", commit], cwd=repo)
    readme = repo / "template/README.md.jinja"
    readme.write_text(readme.read_text() + f"\nA line after release {NEWEST}.\n")
    commit_everything(repo, f"after {NEWEST}")
    return repo


def copy_at(template: Path, ref: str, dest: Path, **answers: object) -> Path:
    data = [arg for k, v in answers.items() for arg in ("-d", f"{k}={v}")]
    copier(
        "copy", "--trust", "--defaults", *data, "--vcs-ref", ref, template, dest, cwd=dest.parent
    )
    run(["git", "init", "-q", "-b", "main"], cwd=dest)
    commit_everything(dest, f"generated at {ref}")
    return dest


def fresh_schema(template: Path, tmp_path: Path, ref: str, **answers: object) -> dict[str, str]:
    """The queue of a new project made at `ref`, as the Supabase CLI pushes it."""
    project = copy_at(template, ref, tmp_path / f"fresh-{ref}", **answers)
    cluster = start_hosted_cluster()
    try:
        push_migrations(project, cluster.url())
        return queue_schema(cluster, str(answers.get("queue_schema", "pgqueue")))
    finally:
        cluster.destroy()


def missing(cluster, schema: str) -> list[str]:
    """Which of what 1.1.0 added after 202d53d the database lacks."""
    with cluster.connect() as db:
        return [
            f for f in ADDED_AFTER
            if db.execute("select to_regprocedure(%s)", (f"{schema}.{f}",)).fetchone()[0] is None
        ]  # fmt: skip


def assert_the_queue_works(cluster, schema: str) -> None:
    """What workers call that 202d53d lacked (checkout()) is there, and a claim of rows
    completes. take_rows() was internal: from 1.3.0 on, the claim's _take() does its work."""
    assert missing(cluster, schema) == ["take_rows(text,text,integer,text[],integer)"]
    with cluster.connect(autocommit=True) as db:
        db.execute(f"select {schema}.enqueue('after-repair')")
        claimed = db.execute(
            f"select id, lock_token from {schema}.complete_and_claim('w', kinds => %s)",
            (["after-repair"],),
        ).fetchall()
        assert len(claimed) == 1
        (ids, tokens) = ([claimed[0][0]], [claimed[0][1]])
        db.execute(
            f"select * from {schema}.complete_and_claim('w', %s, %s, 0)", (ids, tokens)
        ).fetchall()
        assert db.execute(f"select status from {schema}.job(%s)", ids).fetchone() == ("done",)
        assert db.execute(f"select {schema}.checkout('w')").fetchone() == (False,)


# How a project came to hold 202d53d's text, and what it is updated to: made at (with answers),
# updated at 202d53d (a project made at a release), updated through a release made before the
# check, updated to (None: what `copier update` picks, the newest release).
PATHS = {
    "copied-at-202d53d-to-the-newest-release": (DEVELOPMENT_COMMIT, {}, None, None, None),
    "copied-at-202d53d-with-its-own-answers-to-the-newest-release": (
        DEVELOPMENT_COMMIT, RELEASE_ANSWERS["python-postgres-custom"], None, None, None
    ),
    "copied-at-202d53d-through-1.1.0-to-head": (DEVELOPMENT_COMMIT, {}, None, "v1.1.0", "HEAD"),
    "made-at-1.0.0-updated-at-202d53d-to-the-newest-release": (
        "v1.0.0", {}, DEVELOPMENT_COMMIT, None, None
    ),
}  # fmt: skip


def update(project: Path, ref: str | None) -> subprocess.CompletedProcess:
    done = copier("update", "--trust", "--defaults", *(["--vcs-ref", ref] if ref else []),
                  cwd=project)  # fmt: skip
    commit_everything(project, f"updated to {ref or 'the newest release'}")
    return done


@pytest.mark.parametrize(("made", "answers", "via", "through", "to"), PATHS.values(), ids=PATHS)
def test_a_project_from_a_development_commit_is_repaired_on_update(
    template: Path,
    tmp_path: Path,
    made: str,
    answers: dict,
    via: str | None,
    through: str | None,
    to: str | None,
) -> None:
    """Copied at 202d53d, or made at 1.0.0 and updated at 202d53d; updated straight to the
    newest release, or first to v1.1.0, which cannot tell and keeps the old text, then to
    HEAD: the update adds one repair migration right after the file it repairs, and the queue,
    jobs and all, is then a new project's."""
    schema = answers.get("queue_schema", "pgqueue")
    # the file with 202d53d's text: the baseline, or the step from 1.0.0
    stale = "20261207000000_pgqueue_1_1_0_client_jobs.sql" if via else STALE
    project = copy_at(template, made, tmp_path / "app", **answers)
    cluster = start_hosted_cluster()
    try:
        push_migrations(project, cluster.url())
        with cluster.connect(autocommit=True) as db:
            db.execute("update cron.job set active = false")
            ids = fill_queue(db, schema)
            jobs = f"select id, status from {schema}.all_jobs order by id"
            before = db.execute(jobs).fetchall()
        if via:
            update(project, via)
        development = (project / MIGRATIONS / stale).read_text()
        if through:  # a release made before the check: the old text stays, nothing is said
            assert said(update(project, through)) == []
            assert (project / MIGRATIONS / stale).read_text() == development
        supabase(project, "migration", "up", "--db-url", cluster.url())
        assert missing(cluster, schema) == list(ADDED_AFTER), "what the issue found"

        done = update(project, to)
        # HEAD is commits after the newest release's tag: 1.4.0.post<n>...
        version = re.escape(NEWEST) + (r"\.post\d" if to else r"\n")
        assert re.search(f"Updating to template version {version}", done.stderr), done.stderr
        head = run(["git", "rev-parse", "--short=7", "HEAD"], cwd=template).strip()
        assert said(done) == [
            f"pgqueue-template: {MIGRATIONS}/{REPAIR} repairs the queue migration this project "
            f"got from template commit {DEVELOPMENT_COMMIT}, not a release, to what "
            f"{f'commit {head}' if to else f'release {NEWEST}'} has."
        ], done.stderr
        assert (project / MIGRATIONS / stale).read_text() == development, "never rewritten"
        repair = (project / MIGRATIONS / REPAIR).read_text()
        assert f"create or replace function {schema}.checkout(worker text)" in repair
        assert f"create sequence if not exists {schema}.claim_fronts" in repair

        with cluster.connect(user="postgres", autocommit=True) as db:
            db.execute(repair)  # once by hand: it can run again, as the CLI does next
        supabase(project, "migration", "up", "--db-url", cluster.url())
        with cluster.connect(autocommit=True) as db:
            assert db.execute(jobs).fetchall() == before
            running = (ids["running"][0], ids["running_token"][0])
            assert db.execute(f"select {schema}.heartbeat(%s, %s)", running).fetchone() == (True,)
        upgraded = queue_schema(cluster, schema)
        assert_the_queue_works(cluster, schema)
    finally:
        cluster.destroy()
    fresh = fresh_schema(template, tmp_path, to or f"v{NEWEST}", **answers)
    assert differences(fresh, upgraded) == []

    # the next update knows the repair: nothing more to add, nothing said
    again = copier("update", "--trust", "--defaults", "--vcs-ref", "HEAD", cwd=project)
    assert said(again) == []
    assert not list((project / MIGRATIONS).glob("*_repair.sql"))[1:]


def test_a_development_commit_with_the_releases_migrations_updates_without_a_word(
    template: Path, tmp_path: Path
) -> None:
    """A copy of a development commit that has the newest release's migrations, as released
    (the one before the release's tag): nothing to repair, nothing said, nothing added but what
    an answer changed asks for; compared with the answers it was rendered with, not the lease
    changed since."""
    project = copy_at(template, f"v{NEWEST}~1", tmp_path / "app")
    (commit,) = re.findall(r"^_commit: (\S+)$", (project / ".copier-answers.yml").read_text(), re.M)
    assert hook.unreleased(template, [commit]) == [commit], "the check looks at it"
    migrations = sorted(p.name for p in (project / MIGRATIONS).iterdir())
    done = copier("update", "--trust", "--defaults", "-d", "lease_seconds=600", cwd=project)
    (config,) = {p.name for p in (project / MIGRATIONS).iterdir()} - set(migrations)
    assert said(done) == [], done.stderr
    assert f"{config} applies the changed answers: lease_seconds" in done.stdout
    commit_everything(project, "lease 600")
    done = copier("update", "--trust", "--defaults", "--vcs-ref", "HEAD", cwd=project)
    assert said(done) == []
    # and the steps of releases after the newest that HEAD has, as for any of its projects
    later = [m["name"] for p in (REPO / "template" / MIGRATIONS).iterdir()
             if (m := STEP_FROM_NEWEST.match(p.name))]  # fmt: skip
    assert sorted(p.name for p in (project / MIGRATIONS).iterdir()) == sorted(
        [*migrations, config, *later]
    )


def test_a_difference_that_cannot_be_repaired_in_place_refuses_the_update(
    template: Path, tmp_path: Path
) -> None:
    """A development commit whose baseline made a table the release does not have: the update
    is refused, naming the commit, the file and what differs, and changes nothing; the steps it
    gives (render the release, a migration of the project's own, marked) then let it through."""
    repo = tmp_path / "template"
    run(["git", "clone", "-q", template, repo], cwd=tmp_path)
    # the first of a new project's baseline migrations, as the template names it
    (baseline,) = (repo / "template/supabase/migrations").glob(f"*{baseline_migrations()[0]}*")
    released = baseline.read_text()
    baseline.write_text(released + "\ncreate table {{ queue_schema }}.notes (id bigint);\n")
    commit_everything(repo, "a table tried out")
    tried = run(["git", "rev-parse", "--short=7", "HEAD"], cwd=repo).strip()
    baseline.write_text(released)
    commit_everything(repo, "the table taken out again")
    project = copy_at(repo, "HEAD~1", tmp_path / "app")
    answers = (project / ".copier-answers.yml").read_text()
    cluster = start_hosted_cluster()
    try:
        push_migrations(project, cluster.url())
        refused_then_repaired(repo, project, tried, answers, tmp_path)
        supabase(project, "migration", "up", "--db-url", cluster.url())
        repaired = queue_schema(cluster, "pgqueue")
    finally:
        cluster.destroy()
    assert differences(fresh_schema(repo, tmp_path, "HEAD"), repaired) == []


def refused_then_repaired(
    repo: Path, project: Path, tried: str, answers: str, tmp_path: Path
) -> None:
    """The update refused, changing nothing; then the steps its message gives, as written."""
    refused = copier(
        "update", "--trust", "--defaults", "--vcs-ref", "HEAD", cwd=project, check=False
    )
    assert refused.returncode != 0
    head = run(["git", "rev-parse", "--short=7", "HEAD"], cwd=repo).strip()
    assert said(refused)[0] == (
        f"pgqueue-template: this project's queue migrations come from template commit {tried}, "
        f"which is not a release, and differ from commit {head}'s in what cannot be repaired "
        "in place:"
    ), refused.stderr
    assert (
        f"\n  {baseline_migrations()[0]}: differs from commit "
        f"{head}'s in `create table pgqueue.notes (id bigint);`\n"
    ) in refused.stderr, refused.stderr
    assert run(["git", "status", "--porcelain"], cwd=project) == "", "nothing was written"
    assert (project / ".copier-answers.yml").read_text() == answers

    # step 1 as the message writes it: the release rendered with the project's answers
    (render,) = re.findall(r"^ +(copier copy .*)$", refused.stderr, re.M)
    release = tmp_path / "release"
    subprocess.run(
        [sys.executable, "-m", *render.replace("/tmp/release", str(release)).split()],
        cwd=project, check=True, capture_output=True,
    )  # fmt: skip
    text = (release / MIGRATIONS / baseline_migrations()[0]).read_bytes()
    assert b"pgqueue.notes" not in text
    # steps 2 and 3: the project's own migration, marked
    marker = re.search(r"^ +(-- pgqueue-template repair: .*)$", refused.stderr, re.M)[1]
    digest = hashlib.sha256(text).hexdigest()
    (project / MIGRATIONS / "20261220000000_drop_notes.sql").write_text(
        re.sub(r"<sha256sum of [^>]+>", digest, marker) + "\ndrop table pgqueue.notes;\n"
    )
    commit_everything(project, "our repair")
    done = copier("update", "--trust", "--defaults", "--vcs-ref", "HEAD", cwd=project)
    assert said(done) == []


def test_a_migration_no_release_has_refuses_the_update_until_marked(
    template: Path, tmp_path: Path
) -> None:
    """A development commit's migration that the release does not have: the update is refused;
    marked as the message says, it goes through, and the file Copier deletes comes back."""
    repo = tmp_path / "template"
    run(["git", "clone", "-q", template, repo], cwd=tmp_path)
    extra = "20261210000000_pgqueue_extra.sql"
    condition = f"{{% if queue_baseline == '{current_baseline()}' %}}"
    source = repo / f"template/{MIGRATIONS}/{condition}{extra}{{% endif %}}.jinja"
    source.write_text("select 1;\n")
    commit_everything(repo, "a migration tried out")
    source.unlink()
    commit_everything(repo, "and taken out again")
    project = copy_at(repo, "HEAD~1", tmp_path / "app")

    refused = copier(
        "update", "--trust", "--defaults", "--vcs-ref", "HEAD", cwd=project, check=False
    )
    assert refused.returncode != 0
    assert re.search(
        rf"^  {extra}: commit \w+ has no migration of this name$", refused.stderr, re.M
    )
    assert run(["git", "status", "--porcelain"], cwd=project) == "", "nothing was written"

    marker = re.search(r"^ +(-- pgqueue-template repair: .*)$", refused.stderr, re.M)[1]
    assert marker == f'-- pgqueue-template repair: {{"{extra}": "none"}}'
    (project / MIGRATIONS / "20261210000000_ours.sql").write_text(f"{marker}\nselect 2;\n")
    commit_everything(project, "ours")
    done = copier("update", "--trust", "--defaults", "--vcs-ref", "HEAD", cwd=project)
    assert said(done) == []
    assert f"git checkout HEAD -- {MIGRATIONS}/{extra}" in refused.stderr
    assert not (project / MIGRATIONS / extra).exists(), "what step 4 says"
    run(["git", "checkout", "HEAD", "--", f"{MIGRATIONS}/{extra}"], cwd=project)
    assert (project / MIGRATIONS / extra).read_text() == "select 1;\n"


def test_the_template_knows_the_releases_the_tests_know() -> None:
    assert {v: c[:7] for v, c in hook.RELEASES.items()} == RELEASES


def test_statements_are_split_where_sql_ends_them() -> None:
    sql = (
        "-- a comment; not a statement\ncreate table s.t (a text default ';');\n\n"
        "create or replace function s.f(x int)\nreturns int language sql as $$ select 1; $$;\n"
        "comment on table s.t is 'it''s; fine';\n"
        'grant select on s."odd;name" to r;\n'
    )
    assert hook.statements(sql) == [
        "create table s.t (a text default ';');",
        "create or replace function s.f(x int)\nreturns int language sql as $$ select 1; $$;",
        "comment on table s.t is 'it''s; fine';",
        'grant select on s."odd;name" to r;',
    ]


def test_a_repair_redefines_in_place_and_refuses_the_rest() -> None:
    old = "create or replace function s.f(x int) returns int as $$ select 1 $$;\n"
    new = (
        "create or replace function s.f(x int) returns int as $$ select 2 $$;\n"
        "create sequence s.fronts;\ncreate index t_a_idx on s.t (a);\n"
        "grant usage on s.fronts to r;\n"
    )
    assert hook.repair(old, new) == (
        [
            "create or replace function s.f(x int) returns int as $$ select 2 $$;",
            "create sequence if not exists s.fronts;",
            "create index if not exists t_a_idx on s.t (a);",
            "grant usage on s.fronts to r;",
        ],
        [],
    )
    # a table, a dropped function, a sequence made otherwise: nothing can be repaired
    assert hook.repair(
        old + "create sequence s.q;\n", "create table s.t (a int);\ncreate sequence s.q start 5;\n"
    )[1] == [
        "create or replace function s.f(x int) returns int as $$ select 1 $$;",
        "create sequence s.q;",
        "create table s.t (a int);",
        "create sequence s.q start 5;",
    ]
