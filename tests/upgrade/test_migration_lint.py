"""squawk, the migration linter a generated project's pre-commit (and so its CI) runs, passes
every queue migration a release adds, with the project's own `.squawk.toml`: a new project's
baseline and the step from 0.1.0, for every variant. Release 0.1.0's four migrations are
frozen (users have applied them) and excluded by that config."""

from __future__ import annotations

import fnmatch
import json
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path
from typing import NamedTuple

import pytest
import yaml

from testkit.project import VARIANTS, Variant, baseline_migrations, render

SQUAWK = Path(sys.executable).parent / "squawk"
# what a project created at each release has of the current release's queue: its baseline,
# or the steps since
STEP_1_3_0 = "20261209000000_pgqueue_1_3_0_readable.sql"
STEP_1_4_0 = "20261210000000_pgqueue_1_4_0_toolkit.sql"
STEP_1_5_0 = "20261211000000_pgqueue_1_5_0_workflows.sql"
RELEASE_MIGRATIONS = {
    "1.5.0": set(baseline_migrations("1.5.0")),
    "1.4.0": {*baseline_migrations("1.4.0"), STEP_1_5_0},
    "1.3.0": {*baseline_migrations("1.3.0"), STEP_1_4_0, STEP_1_5_0},
    "1.2.0": {"20261208000000_pgqueue_1_2_0.sql", STEP_1_3_0, STEP_1_4_0, STEP_1_5_0},
    "1.1.0": {
        "20261207000000_pgqueue_1_1_0.sql",
        "20261208000000_pgqueue_1_2_0_security.sql",
        STEP_1_3_0,
        STEP_1_4_0,
        STEP_1_5_0,
    },
    "1.0.0": {
        "20261206000000_pgqueue_1_0_0.sql",
        "20261207000000_pgqueue_1_1_0_client_jobs.sql",
        "20261208000000_pgqueue_1_2_0_security.sql",
        STEP_1_3_0,
        STEP_1_4_0,
        STEP_1_5_0,
    },
    "0.1.0": {
        "20261206000000_pgqueue_1_0_0_from_0_1_0.sql",
        "20261207000000_pgqueue_1_1_0_client_jobs.sql",
        "20261208000000_pgqueue_1_2_0_security.sql",
        STEP_1_3_0,
        STEP_1_4_0,
        STEP_1_5_0,
    },
}


class Finding(NamedTuple):
    file: str  # the migration's name
    rule: str
    line: str  # the line squawk points at, stripped


def squawk(project: Path, *files: str) -> list[Finding]:
    """squawk run as the project's pre-commit hook runs it (in the project, which has its
    .squawk.toml, on paths relative to it), its findings in reading order."""
    assert (project / ".squawk.toml").is_file()
    proc = subprocess.run(
        [SQUAWK, "--reporter", "json", "--no-error-on-unmatched-pattern", *files],
        cwd=project,
        capture_output=True,
        text=True,
    )
    reported = json.loads(proc.stdout or "[]")
    assert proc.returncode == (1 if reported else 0), proc.stderr
    return [
        Finding(
            Path(f["file"]).name,
            f["rule_name"],
            # squawk's json lines count from 0
            (project / f["file"]).read_text().splitlines()[f["line"]].strip(),
        )
        for f in reported
    ]


def migrations(project: Path) -> list[str]:
    return sorted(
        p.relative_to(project).as_posix() for p in project.glob("supabase/migrations/*.sql")
    )


@pytest.mark.parametrize("baseline", RELEASE_MIGRATIONS, ids=lambda b: f"from-{b}")
@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_release_migrations_pass_squawk(
    template: Path, tmp_path: Path, variant: Variant, baseline: str
) -> None:
    """A new project's baseline, and the steps of projects created at earlier releases (with
    0.1.0's own four migrations, which the config excludes): no finding. A finding is fixed in
    queue/<release>/, or weighed and accepted there with `-- squawk-ignore <rule>` and the
    reason on the line before the statement (squawk reports an ignore that no longer matches
    anything)."""
    project = render(template, tmp_path / "app", queue_baseline=baseline, **variant.answers)
    files = migrations(project)
    names = {Path(f).name for f in files}
    assert RELEASE_MIGRATIONS[baseline] <= names
    found = squawk(project, *files)
    assert found == []


def test_squawk_flags_a_migration_that_locks_a_live_table(template: Path, tmp_path: Path) -> None:
    """The config leaves the rules that matter on: an index built on the live jobs table
    without CONCURRENTLY, and no lock_timeout, are reported; the same index on a table the
    migration creates, after a lock_timeout, is not."""
    project = render(template, tmp_path / "app")
    bad = project / "supabase/migrations/20990101000000_jobs_by_kind.sql"
    bad.write_text("create index jobs_kind_idx on pgqueue.jobs (kind);\n")
    good = project / "supabase/migrations/20990101000001_notes.sql"
    good.write_text(
        "set local lock_timeout = '5s';\n"
        "create table public.notes (id bigint generated always as identity primary key,"
        " body text not null);\n"
        "create index notes_body_idx on public.notes (body);\n"
    )
    assert sorted(squawk(project, bad.relative_to(project).as_posix())) == [
        Finding(bad.name, "require-concurrent-index-creation", bad.read_text().strip()),
        Finding(bad.name, "require-lock-timeout", bad.read_text().strip()),
    ]
    assert squawk(project, good.relative_to(project).as_posix()) == []


def test_squawk_config_excludes_only_the_0_1_0_migrations(template: Path, tmp_path: Path) -> None:
    """The excluded paths are exactly 0.1.0's four migrations, in a project that has them: no
    later release's migration hides behind a pattern. A new project's config excludes none."""
    old = render(template, tmp_path / "old", queue_baseline="0.1.0")
    patterns = tomllib.loads((old / ".squawk.toml").read_text())["excluded_paths"]
    excluded = [f for f in migrations(old) if any(fnmatch.fnmatchcase(f, p) for p in patterns)]
    assert [Path(f).name for f in excluded] == [
        "20261202000000_pgqueue_schema.sql",
        "20261202000001_pgqueue_functions.sql",
        "20261202000002_pgqueue_wakeup.sql",
        "20261202000003_pgqueue_sweeper.sql",
    ]
    new = render(template, tmp_path / "new")
    assert "excluded_paths" not in tomllib.loads((new / ".squawk.toml").read_text())


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_pre_commit_runs_the_squawk_these_tests_run(
    template: Path, tmp_path: Path, variant: Variant
) -> None:
    project = render(template, tmp_path / "app", **variant.answers)
    config = yaml.safe_load((project / ".pre-commit-config.yaml").read_text())
    [hook] = [h for repo in config["repos"] for h in repo["hooks"] if h["id"] == "squawk"]
    assert hook["additional_dependencies"] == [f"squawk-cli=={version('squawk-cli')}"]
    assert hook["entry"].split()[0] == "squawk"
    assert hook["files"] == r"^supabase/migrations/.*\.sql$"
