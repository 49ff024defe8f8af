"""Fixtures for the dashboard's browser tests: Debian's chromium driven by Playwright, the
dashboard of a rendered project served as its README says, and a queue holding jobs in every
state."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg
import pytest
from playwright.sync_api import Page
from psycopg.types.json import Jsonb

from testkit.cluster import free_port
from testkit.project import REPO, Variant, render, run, variant
from tests.support.jobs import enqueue, wait_until
from tests.support.workers import SCRIPT, Installed

# Screenshots of each run, for a person to look at (gitignored).
ARTIFACTS = REPO / "test-artifacts" / "dashboard"
PASSWORD = "a dashboard password for the tests"

# One Python variant per claim transport (the dashboard is the same code in both worker
# styles), and the edge variant's dashboard/ with its psycopg source. The supabase one opens
# with the service role key (no DASHBOARD_PASSWORD set), the others with DASHBOARD_PASSWORD.
VARIANTS = [variant("python", "postgres"), variant("python", "supabase"), variant("edge")]


@dataclass
class EdgeDashboard:
    """An edge project's dashboard/, installed in a venv of its own as its README says."""

    project: Path  # the rendered edge project
    venv: Path

    @property
    def path(self) -> Path:
        return self.project / "dashboard"

    def bin(self, name: str) -> Path:
        return self.venv / "bin" / name


@pytest.fixture(scope="session")
def edge_dashboard(template: Path, tmp_path_factory: pytest.TempPathFactory) -> EdgeDashboard:
    root = tmp_path_factory.mktemp("edge-dashboard")
    installed = EdgeDashboard(
        render(template, root / "project", worker_style="edge"), root / "venv"
    )
    # --locked: the committed uv.lock must match dashboard/pyproject.toml as rendered.
    run(
        ["uv", "sync", "--locked", "--extra", "dev", "--python", sys.executable, "--no-progress"],
        cwd=installed.path,
        env={"UV_PROJECT_ENVIRONMENT": str(installed.venv)},
    )
    return installed


@dataclass
class Dashboard:
    """`my-app dashboard` of a rendered project, running."""

    url: str
    password: str
    log: Path
    proc: subprocess.Popen

    def output(self) -> str:
        return self.log.read_text()


@pytest.fixture(scope="module", params=VARIANTS, ids=str)
def dashboard(
    request: pytest.FixtureRequest,
    stack_env: dict,
    service_role_key: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Dashboard]:
    """The dashboard of the variant, served as its README says (`my-app dashboard`, or
    `dashboard` from an edge project's dashboard/), on a free port."""
    served: Variant = request.param
    if served.python:
        installed: Installed = request.getfixturevalue("installs")[served].result()
        command = [installed.bin(SCRIPT), "dashboard"]
    else:
        command = [request.getfixturevalue("edge_dashboard").bin("dashboard")]
    with_key = served.claim_transport == "supabase"
    password = service_role_key if with_key else PASSWORD
    port = free_port()
    log = tmp_path_factory.mktemp("dashboard") / "dashboard.log"
    env = {**os.environ, **stack_env}
    env.pop("DASHBOARD_PASSWORD", None)
    if not with_key:
        env["DASHBOARD_PASSWORD"] = PASSWORD
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*command, "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    running = Dashboard(f"http://127.0.0.1:{port}", password, log, proc)
    try:
        wait_until(lambda: _answers(running), timeout=30, what="the dashboard to start")
        yield running
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _answers(served: Dashboard) -> bool:
    assert served.proc.poll() is None, f"the dashboard exited:\n{served.output()}"
    try:
        return httpx.get(f"{served.url}/login", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture
def screenshot(page: Page, request: pytest.FixtureRequest) -> Iterator:
    """screenshot(name, full_page=True): the page as it is now (the whole page, or the
    1280x900 window), saved under test-artifacts/dashboard/<test>/<name>.png."""
    folder = ARTIFACTS / request.node.name.replace("[", "-").rstrip("]")
    folder.mkdir(parents=True, exist_ok=True)

    def take(name: str, full_page: bool = True) -> Path:
        path = folder / f"{name}.png"
        page.screenshot(path=path, full_page=full_page)
        print(f"screenshot: {path}")
        return path

    yield take


@pytest.fixture
def jobs(db: psycopg.Connection) -> Iterator[dict[str, int]]:
    """A queue with jobs in every state, and the ids of some: `queued`, `scheduled`,
    `running`, `retrying`, `done` (with a result), `dead` and `dead_too` (dead letters whose
    payload and error hold markup), `cancelled`, and the queue `mail`, paused with jobs.
    Finished jobs are spread over the last half hour, for the throughput chart."""
    ids = {}
    for minutes_ago in range(0, 28, 3):
        _finish_some(db, minutes_ago)
    # Each claim below takes the one runnable job of its kind there is at that point.
    for name, error in (
        ("dead", "ValueError: <script>alert('error')</script> is not an e-mail address"),
        ("dead_too", "HTTP 410 Gone from https://example.com/old"),
    ):
        ids[name] = _one(
            db,
            "select pgqueue.enqueue('send_email', %s, max_attempts => 1)",
            Jsonb({"to": "<script>alert('payload')</script>", "subject": name}),
        )
        db.execute("select pgqueue.fail(%s, %s, %s)", (ids[name], _claim(db, "send_email"), error))
    ids["cancelled"] = enqueue(db, "send_email", to="nobody@example.com")
    db.execute("select pgqueue.cancel(%s)", (ids["cancelled"],))
    ids["done"] = enqueue(db, "render_report", month="2026-11")
    db.execute(
        "select pgqueue.complete(%s, %s, %s)",
        (ids["done"], _claim(db, "render_report"), Jsonb({"pages": 12, "url": "s3://r/11.pdf"})),
    )
    ids["running"] = enqueue(db, "resize_image", image="cat.png")
    token = _claim(db, "resize_image")
    db.execute("select pgqueue.progress(%s, %s, %s)", (ids["running"], token, Jsonb({"pct": 40})))
    ids["retrying"] = enqueue(db, "send_webhook", url="https://example.com/slow")
    db.execute(
        "select pgqueue.fail(%s, %s, 'timed out after 30 s: https://example.com/slow')",
        (ids["retrying"], _claim(db, "send_webhook")),
    )
    ids["scheduled"] = _one(
        db,
        "select pgqueue.enqueue('send_webhook', %s, run_after => now() + interval '1 hour')",
        Jsonb({"url": "https://example.com/hook"}),
    )
    ids["queued"] = enqueue(db, "send_email", to="ada@example.com")
    enqueue(db, "send_email", to="grace@example.com")
    for n in range(3):
        _one(db, "select pgqueue.enqueue('send_email', %s, queue => 'mail')", Jsonb({"n": n}))
    db.execute("select pgqueue.pause('mail')")
    yield ids
    db.execute("select pgqueue.resume(queue) from pgqueue.queues where paused_at is not null")


def _finish_some(db: psycopg.Connection, minutes_ago: int) -> None:
    """Jobs done (and one dead-lettered every 9 minutes) `minutes_ago` minutes ago."""
    count = 3 + (minutes_ago * 7) % 11
    db.execute(
        "select pgqueue.enqueue_many(%s)",
        (Jsonb([{"kind": "send_email", "payload": {"n": n}} for n in range(count)]),),
    )
    claimed = db.execute(
        "select id, lock_token from pgqueue.claim('w', %s, kinds => array['send_email'])",
        (count,),
    ).fetchall()
    if minutes_ago % 9 == 0:
        job_id, token = claimed.pop()
        db.execute(
            "select pgqueue.fail(%s, %s, 'SMTP 550: mailbox unavailable', retryable => false)",
            (job_id, token),
        )
        db.execute(
            "update pgqueue.job_history set finished_at = now() - make_interval(mins => %s)"
            " where id = %s",
            (minutes_ago, job_id),
        )
    db.execute(
        "select pgqueue.complete_many(%s, %s)",
        ([i for i, _ in claimed], [t for _, t in claimed]),
    )
    db.execute(
        "update pgqueue.done_batches set finished_at = now() - make_interval(mins => %s)"
        " where id_range && int8range(%s, %s, '[]')",
        (minutes_ago, min(i for i, _ in claimed), max(i for i, _ in claimed)),
    )


def _claim(db: psycopg.Connection, kind: str) -> str:
    return _one(db, "select lock_token from pgqueue.claim('w', 1, kinds => array[%s])", kind)


def _one(db: psycopg.Connection, sql: str, *params: object):
    row = db.execute(sql, params).fetchone()
    assert row is not None, sql
    return row[0]
