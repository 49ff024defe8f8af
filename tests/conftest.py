from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.support.cluster import Cluster
from tests.support.pg_net import PgNetWorker
from tests.support.project import push_migrations, render, snapshot_template
from tests.support.stack import start_supabase_like_cluster


@pytest.fixture(scope="session")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The template repo as it is on disk, committed into a throwaway git repo."""
    return snapshot_template(tmp_path_factory.mktemp("template"))


@pytest.fixture(scope="session")
def stack() -> Iterator[Cluster]:
    cluster = start_supabase_like_cluster()
    yield cluster
    cluster.destroy()


@pytest.fixture(scope="session")
def project(template: Path, stack: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project rendered with the default answers, its migrations pushed to the stack by the
    real Supabase CLI. The pg_cron sweep stays scheduled but inactive, so tests decide when
    sweep() runs."""
    path = render(template, tmp_path_factory.mktemp("rendered") / "myapp")
    push_migrations(path, stack.url())
    with stack.connect(autocommit=True) as conn:
        conn.execute("update cron.job set active = false where jobname = 'pgqueue-sweep'")
    return path


@pytest.fixture
def db(stack: Cluster, project: Path) -> Iterator[psycopg.Connection]:
    """A superuser connection to a database with the default project's queue, emptied."""
    with stack.connect(autocommit=True) as conn:
        conn.execute(
            "truncate pgqueue.jobs restart identity;"
            "truncate net.http_request_queue, net._http_response, vault.secrets;"
        )
        yield conn


@pytest.fixture
def pg_net(stack: Cluster) -> Iterator[PgNetWorker]:
    """The pg_net stand-in's worker, sending committed requests over HTTP."""
    worker = PgNetWorker(stack.dsn()).start()
    yield worker
    worker.stop()
