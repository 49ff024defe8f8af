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
                                             (supabase start, a hosted project)
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testkit.cluster import PG_BIN, Cluster
from testkit.hosted import SUPERUSER, start_hosted_cluster
from testkit.project import REPO, VARIANTS, Variant, push_migrations, render
from tests.support.doc_examples import Example, examples


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
