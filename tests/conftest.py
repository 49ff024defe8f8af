"""The fixtures more than one folder of tests uses: the template as it is on disk, the stack
(one Supabase-like PostgreSQL cluster per session), the default project migrated onto it, a
connection to its emptied queue, the PostgREST stand-in in front of it (also as an app's
signed-in users reach it, the queue's public schema exposed, with their kinds, owners and
rate buckets cleared around a test), the stack under the names a project reads, an
interpreter that can run any Python variant's worker, each Python variant installed in a
venv of its own, and a headless chromium with a fresh page. Each folder's conftest.py has
only its own."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest
from playwright.sync_api import Browser, Page, sync_playwright
from psycopg.types.json import Jsonb

from testkit.cluster import Cluster
from testkit.hosted import start_hosted_cluster
from testkit.postgrest import PostgRESTStandIn, make_jwt
from testkit.project import (
    PYTHON_VARIANTS,
    Variant,
    push_migrations,
    render,
    snapshot_template,
    snapshot_with_history,
)
from testkit.stack import clear_wake_ups
from tests.support.wake_signing import secret_for
from tests.support.workers import Installed, install

# The system browser (scripts/setup installs Debian's chromium); Playwright never downloads
# one here. This machine has no network: without these flags chromium stalls on start-up
# looking for updates, sync and the like.
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1280, "height": 900}


@pytest.fixture(scope="session")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The template repo as it is on disk, committed into a throwaway git repo."""
    return snapshot_template(tmp_path_factory.mktemp("template"))


@pytest.fixture(scope="session")
def history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This repo's history with the working tree on top: the releases and HEAD side by side,
    for `copier update` from a release."""
    return snapshot_with_history(tmp_path_factory.mktemp("history") / "template")


@pytest.fixture(scope="session")
def stack() -> Iterator[Cluster]:
    """The session's PostgreSQL cluster, shaped like a hosted Supabase database
    (testkit/hosted.py): `postgres`, as which the Supabase CLI applies migrations, is not a
    superuser; `stack.connect()` and `stack.dsn()` log in as the superuser `supabase_admin`."""
    cluster = start_hosted_cluster()
    yield cluster
    cluster.destroy()


@pytest.fixture(scope="session")
def project(template: Path, stack: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project rendered with the default answers, its migrations pushed to the stack by the
    real Supabase CLI as `postgres`, as on a hosted project. The pg_cron sweep stays scheduled
    but inactive, so tests decide when sweep() runs."""
    path = render(template, tmp_path_factory.mktemp("rendered") / "myapp")
    push_migrations(path, stack.url())
    with stack.connect(autocommit=True) as conn:
        conn.execute("update cron.job set active = false where jobname = 'pgqueue-sweep'")
    return path


@pytest.fixture(scope="session")
def postgrest(stack: Cluster, project: Path) -> Iterator[PostgRESTStandIn]:
    """The Data API over the stack (the PostgREST stand-in), logged in as `authenticator` like
    the real one, in front of the queue the default project migrated."""
    with PostgRESTStandIn(stack.dsn(user="authenticator")) as api:
        yield api


@pytest.fixture(scope="session")
def app_api(stack: Cluster, project: Path) -> Iterator[PostgRESTStandIn]:
    """The Data API as an app's signed-in users reach it: the queue's public schema exposed
    (first, so the default), and the queue's own, which only service_role may use."""
    schemas = ("pgqueue_public", "pgqueue")
    with PostgRESTStandIn(stack.dsn(user="authenticator"), schemas=schemas) as api:
        yield api


@pytest.fixture
def clients(db: psycopg.Connection) -> Iterator[psycopg.Connection]:
    """The db with no kind open to signed-in users and no job owner or rate bucket left, before
    the test and after it."""

    def clean() -> None:
        db.execute("truncate pgqueue.client_kinds, pgqueue.client_jobs, pgqueue.client_rates")

    clean()
    yield db
    clean()


@pytest.fixture
def export_open(clients: psycopg.Connection) -> psycopg.Connection:
    """export_data open to signed-in users, 10 a minute, as docs/client-jobs.md opens it."""
    clients.execute("select pgqueue.allow_client_kind('export_data', 10)")
    return clients


@pytest.fixture(scope="session")
def service_role_key() -> str:
    return make_jwt("service_role")


@pytest.fixture(scope="session")
def wake_secret() -> str:
    """The secret wake-ups are signed with in tests: a string of its own, base64 as Standard
    Webhooks reads a secret (never a Supabase API key, which wake() refuses)."""
    return secret_for("wake-secret-of-the-test-stack-0123456789")


@pytest.fixture(scope="session")
def stack_env(stack: Cluster, postgrest: PostgRESTStandIn, service_role_key: str) -> dict:
    """Our stack under the names `supabase status -o env` prints, which projects read, and
    nothing else: a generated project's own tests and CI have only these (no WAKE_SECRET)."""
    return {
        "API_URL": postgrest.url,
        "SERVICE_ROLE_KEY": service_role_key,
        "DB_URL": stack.dsn(user="postgres"),
    }


@pytest.fixture
def worker_env(stack_env: dict, wake_secret: str) -> dict:
    """What a deployed worker has: the stack, and the wake-up secret (WAKE_SECRET) the HTTP
    worker checks, which its README has the user make before starting it."""
    return {**stack_env, "WAKE_SECRET": wake_secret}


@pytest.fixture
def db(stack: Cluster, project: Path) -> Iterator[psycopg.Connection]:
    """A superuser connection to a database with the default project's queue, emptied, and
    pg_net's requests and responses, Vault's secrets and the wake-up settings with it."""
    with stack.connect(autocommit=True) as conn:
        conn.execute(
            "truncate pgqueue.jobs, pgqueue.job_batches, pgqueue.job_history, pgqueue.done_batches,"
            " pgqueue.claims, pgqueue.claimed_keys, pgqueue.job_progress,"
            " pgqueue.job_errors, pgqueue.job_snoozes, pgqueue.waiting_jobs,"
            " pgqueue.job_dependencies, pgqueue.job_workflows"
            " restart identity;"
            "truncate net.http_request_queue, net._http_response, vault.secrets;"
        )
        clear_wake_ups(conn)
        yield conn
        clear_wake_ups(conn)


@pytest.fixture
def config(db: psycopg.Connection) -> Iterator[dict]:
    """The queue's run-time configuration as seeded (`configure()`); put back after the test,
    whatever the test changed."""
    (seeded,) = db.execute("select pgqueue.configure()").fetchone()
    yield seeded
    restore = {k: v for k, v in seeded.items() if k != "updated_at"}
    db.execute("select pgqueue.configure(%s)", (Jsonb(restore),))


@pytest.fixture
def flow(db: psycopg.Connection, config: dict) -> Iterator[psycopg.Connection]:
    """The db with no queue state (pause, rate limit), concurrency limit or schedule before and
    after the test, and its configuration put back: a test that fails half-way must not leave
    the default queue paused for the next one."""

    def clean() -> None:
        db.execute(
            "truncate pgqueue.queues, pgqueue.concurrency_limits, pgqueue.running_keys;"
            "select pgqueue.unschedule(name) from pgqueue.schedules_defined"
        )

    clean()
    yield db
    clean()


@pytest.fixture(scope="session")
def interpreter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv-shaped folder whose bin/python runs pytest's own interpreter (a script, not a
    symlink, so that a virtualenv running pytest stays in effect). It has every dependency a
    generated Python worker needs, so workers of a rendered project's src/ can run on it."""
    root = tmp_path_factory.mktemp("interpreter")
    python = root / "bin" / "python"
    python.parent.mkdir()
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    return root


@pytest.fixture(scope="session")
def installs(
    template: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[Variant, Future[Installed]]]:
    """Every variant, installing in the background from the first test that needs one on
    (uv mostly waits on the network); each test waits for its own variant only."""
    with ThreadPoolExecutor(max_workers=len(PYTHON_VARIANTS)) as pool:
        yield {
            variant: pool.submit(install, template, tmp_path_factory.mktemp(str(variant)), variant)
            for variant in PYTHON_VARIANTS
        }


@pytest.fixture(scope="session")
def chromium() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(chromium: Browser) -> Iterator[Page]:
    """A fresh browser window (no cookies), 1280x900."""
    context = chromium.new_context(viewport=VIEWPORT)
    yield context.new_page()
    context.close()
