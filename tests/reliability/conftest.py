"""Fixtures for the reliability suite: rendered Python workers with the chaos handlers added,
worker fleets that are killed whatever happens, and a log directory the handlers write to.

The workers run on the interpreter that runs pytest (it has every dependency a generated
worker needs), so this suite installs nothing: tests/worker/ already proves each variant
installs and passes its own checks in a venv of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testkit.cluster import Cluster
from testkit.project import Variant, push_migrations, render, variant
from testkit.stack import start_supabase_like_cluster
from tests.support.workers import HANDLERS, Installed, Workers, with_handlers

# The job kinds this suite runs, in a handler module added to each variant's src/: every
# execution logs "start", then "raise" or "ok", to a file per worker process in audit_dir.
CHAOS_HANDLERS = HANDLERS / "reliability.py"
# The variants this suite drives
PYTHON = variant("python", "postgres")
HTTP = variant("python-http", "postgres")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents:
            item.add_marker(pytest.mark.reliability)


@pytest.fixture(scope="session")
def chaos_variants(
    template: Path, interpreter: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[Variant, Installed]:
    """Each variant this suite drives, rendered with the defaults, its src/ copied with the
    chaos handlers added as handlers/reliability.py."""
    variants = {}
    for driven in (PYTHON, HTTP):
        root = tmp_path_factory.mktemp(str(driven))
        path = render(template, root / "project", **driven.answers)
        src = with_handlers(path / "src", root / "chaos" / "src", CHAOS_HANDLERS)
        variants[driven] = Installed(driven, path, interpreter, src)
    return variants


@pytest.fixture
def audit_dir(tmp_path: Path) -> Path:
    """Where the chaos handlers log every execution (a file per worker process)."""
    path = tmp_path / "audit"
    path.mkdir()
    return path


Fleet = Callable[..., Workers]


@pytest.fixture
def fleet(
    chaos_variants: dict[Variant, Installed],
    stack: Cluster,
    audit_dir: Path,
    tmp_path: Path,
) -> Iterator[Fleet]:
    """fleet(variant, **env) -> Workers of that variant against the stack (or the cluster in
    DB_URL), quiet logs, the chaos handlers logging to audit_dir; all killed at teardown."""
    fleets: list[Workers] = []

    def make(variant: Variant = PYTHON, **env: object) -> Workers:
        settings = {
            "DB_URL": stack.dsn(user="postgres"),
            "SERVICE_ROLE_KEY": "unused-by-the-postgres-transport",
            "RELIABILITY_AUDIT_DIR": str(audit_dir),
            "LOG_LEVEL": "WARNING",
            "WORKER_POLL_INTERVAL": "1",
            "WORKER_CONCURRENCY": "20",
            "WORKER_BATCH_SIZE": "20",
            "WORKER_SHUTDOWN_GRACE": "5",
        } | {k: str(v) for k, v in env.items()}
        logs = tmp_path / f"fleet-{len(fleets)}"
        logs.mkdir()
        workers = Workers(chaos_variants[variant], settings, logs)
        fleets.append(workers)
        return workers

    yield make
    for workers in fleets:
        workers.kill_all()


@pytest.fixture
def own_cluster(project: Path) -> Iterator[Cluster]:
    """A cluster of the test's own (a restart would break the shared one's fixtures), with
    synchronous commits: an immediate shutdown must not lose a committed job."""
    cluster = start_supabase_like_cluster(
        fsync="off", synchronous_commit="on", full_page_writes="off"
    )
    try:
        push_migrations(project, cluster.url())
        with cluster.connect(autocommit=True) as conn:
            conn.execute("update cron.job set active = false where jobname = 'pgqueue-sweep'")
        yield cluster
    finally:
        cluster.destroy()
