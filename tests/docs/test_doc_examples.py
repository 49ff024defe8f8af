"""The docs' SQL examples run as written: every ```sql block of docs/*.md, README.md and the
README each variant renders goes through psql, in page order, on a fresh database holding that
project's queue. A renamed function, kind or column then fails here.

A block runs as `postgres`, the role of the SQL editor and `supabase db query` on a hosted
project. An HTML comment before a block (then a blank line), which no reader sees, says
otherwise:

    <!-- example: as superuser (why) -->     run as `supabase_admin`: statements for a local
                                             or self-hosted database's owner (alter system,
                                             alter database ... set)
    <!-- example: first <sql> -->            run <sql> first (psql, so `\\gset` sets variables
                                             the block uses): what the reader already has,
                                             such as their own table or a running job
    <!-- example: not run (why) -->          skipped: `why` must name what this machine lacks
                                             (supabase start, a hosted project, the network)
                                             or say it is the template's own suite

Shell blocks (```sh, bash, shell, console) of the same pages, and of every README a variant
renders, are each run by a test or marked: one that calls the project's CLI runs in
tests/worker/test_cli_examples.py; otherwise the marker says

    <!-- example: run -->                    run here, in bash in an empty directory
    <!-- example: run by tests/x/test_y.py --> that test runs these commands
    <!-- example: not run (why) -->          as above
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testkit.cluster import PG_BIN, Cluster
from testkit.hosted import SUPERUSER, start_hosted_cluster
from testkit.project import REPO, VARIANTS, Variant, push_migrations, render
from tests.support.doc_examples import Example, examples, shell_blocks

CLI = "my-app"


def run_example(cluster: Cluster, example: Example) -> None:
    if example.skipped:
        return
    marker = example.marker
    user = SUPERUSER if marker.startswith("as superuser") else "postgres"
    first = example.first
    assert marker == "" or user == SUPERUSER or first, f"{example}: unknown marker {marker!r}"
    proc = subprocess.run(
        [str(PG_BIN / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", cluster.dsn(user=user)],
        input=first + example.code,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, (
        f"{example} failed as {user}:\n{first}{example.code}--- psql said\n{proc.stderr}"
    )


@pytest.fixture
def fresh_queue() -> Iterator[Callable[[Path], Cluster]]:
    """A hosted-shaped cluster of this test's own, onto which `push(project)` pushes a
    project's migrations with the Supabase CLI."""
    clusters: list[Cluster] = []

    def push(project: Path) -> Cluster:
        cluster = start_hosted_cluster()
        clusters.append(cluster)
        push_migrations(project, cluster.url())
        return cluster

    yield push
    for cluster in clusters:
        cluster.destroy()


DOC_PAGES = sorted(p for p in (REPO / "docs").glob("*.md") if examples(p, p.name))


@pytest.mark.parametrize("page", DOC_PAGES, ids=lambda p: p.name)
def test_the_sql_examples_of_a_docs_page_run(
    template: Path, tmp_path: Path, page: Path, fresh_queue
) -> None:
    """docs/ shows the default answers (schema pgqueue): the default project's queue."""
    cluster = fresh_queue(render(template, tmp_path / "app"))
    for example in examples(page, f"docs/{page.name}"):
        run_example(cluster, example)


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_the_sql_examples_of_a_generated_readme_run(
    template: Path, tmp_path: Path, variant: Variant, fresh_queue
) -> None:
    project = render(template, tmp_path / "app", **variant.answers)
    cluster = fresh_queue(project)
    found = examples(project / "README.md", f"README.md ({variant})")
    assert found, "the README shows SQL"
    handlers = project / "src" / "my_app" / "handlers" / "README.md"
    if handlers.exists():
        found += examples(handlers, f"handlers/README.md ({variant})")
    for example in found:
        run_example(cluster, example)


def test_the_example_runner_fails_on_a_wrong_example(
    template: Path, tmp_path: Path, fresh_queue
) -> None:
    """A renamed function in an example fails, naming the page and the line."""
    cluster = fresh_queue(render(template, tmp_path / "app"))
    wrong = Example("docs/x.md", 7, "select pgqueue.enqueue_job('send_email');\n", "")
    with pytest.raises(AssertionError, match=r"docs/x.md:7 failed as postgres"):
        run_example(cluster, wrong)
    with pytest.raises(AssertionError, match="only for what this machine lacks"):
        run_example(cluster, Example("docs/x.md", 9, "select 1;\n", "not run (too slow)"))


def unaccounted(example: Example, run_elsewhere: set[str], cwd: Path) -> str | None:
    """None when a test runs the shell block (or runs it now, marked `run`) or it is marked not
    to run; else what is wrong with it."""
    if example.skipped:
        return None
    marker = example.marker
    if marker.startswith("run by "):
        test = REPO / marker.removeprefix("run by ").split()[0]
        return None if test.is_file() else f"{example}: {marker!r} names no test file"
    if marker == "run":
        proc = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", example.code],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=60,
        )
        return (
            None if proc.returncode == 0 else f"{example} exited {proc.returncode}:\n{proc.stderr}"
        )
    if example.code in run_elsewhere:
        return None
    return (
        f"{example}: a shell block neither run by a test nor marked "
        f"`<!-- example: not run (why) -->` (marker {marker!r}):\n{example.code}"
    )


def test_every_shell_block_runs_or_says_why_not(template: Path, tmp_path: Path) -> None:
    pages = [(REPO / "README.md", "README.md")]
    pages += [(p, f"docs/{p.name}") for p in sorted((REPO / "docs").glob("*.md"))]
    # tests/worker/test_cli_examples.py runs the CLI's blocks of docs/ and of the README of the
    # python and python-http projects with the postgres transport
    cli_run = [p for p, _ in pages if p.parent.name == "docs"]
    for variant in VARIANTS:
        project = render(template, tmp_path / str(variant), **variant.answers)
        for readme in sorted(project.rglob("README.md")):
            name = f"{readme.relative_to(project)} ({variant})"
            pages.append((readme, name))
            if readme == project / "README.md" and variant.claim_transport == "postgres":
                cli_run.append(readme)
    run_elsewhere = {e.code for page in cli_run for e in shell_blocks(page, "") if CLI in e.code}
    empty = tmp_path / "empty"
    empty.mkdir()
    found = [e for page, name in pages for e in shell_blocks(page, name)]
    assert len(found) >= 20, found
    assert [f for e in found if (f := unaccounted(e, run_elsewhere, empty))] == []


def test_an_unmarked_shell_block_fails(tmp_path: Path) -> None:
    unmarked = Example("docs/x.md", 3, "supabase start\n", "")
    assert "docs/x.md:3: a shell block neither run" in (
        unaccounted(unmarked, set(), tmp_path) or ""
    )
    failing = Example("docs/x.md", 5, "false\n", "run")
    assert (unaccounted(failing, set(), tmp_path) or "").startswith("docs/x.md:5 exited 1")
    assert unaccounted(
        Example("docs/x.md", 7, "supabase start\n", "run by tests/nope.py"), set(), tmp_path
    )
