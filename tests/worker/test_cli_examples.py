"""The docs' command-line examples run as written: each ```sh block of docs/*.md and of the
variant's README that calls the project's CLI runs in bash (`set -e`), in page order, with the
installed project's `my-app` on PATH (`uv run my-app ...` runs it the same way) against a fresh
hosted-shaped database holding the project's queue. A block that starts a server (`worker`,
`dashboard`) passes when the server is still up after a few seconds.

The markers of tests/docs/test_doc_examples.py apply: `first <sh>` runs first (what the reader has
already done), `not run (why)` leaves out a block that needs what this machine lacks (`supabase
start`, a hosted project).
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.cluster import Cluster
from testkit.hosted import start_hosted_cluster
from testkit.postgrest import make_jwt
from testkit.project import REPO, push_migrations, variant
from tests.support.doc_examples import Example, examples
from tests.support.workers import Installed

CLI = "my-app"
# `uv run` as the examples use it: the project's venv is already on PATH.
UV = """uv() {
  if [ "$1" = run ]; then shift; "$@"; else echo "uv $1: not in a CLI example" >&2; return 1; fi
}
"""
SERVERS = (f"{CLI} worker", f"{CLI} dashboard")
UP_FOR = 5  # seconds a server must stay up
SERVER_LOCK = Path(tempfile.gettempdir()) / "pgqueue-template-cli-example-servers.lock"


def cli_examples(page: Path, name: str) -> list[Example]:
    return [e for e in examples(page, name, "sh") if CLI in e.code]


DOC_PAGES = sorted(p for p in (REPO / "docs").glob("*.md") if cli_examples(p, p.name))


@pytest.fixture
def queue_database(installed: Installed) -> Iterator[Cluster]:
    """A database of this test's own with the installed project's queue, so the examples'
    pauses, limits and schedules touch no other test's queue."""
    cluster = start_hosted_cluster()
    try:
        push_migrations(installed.path, cluster.url())
        yield cluster
    finally:
        cluster.destroy()


def run_cli_example(installed: Installed, cluster: Cluster, example: Example) -> str | None:
    """None when the block ran (or is marked not to), else what went wrong."""
    if example.skipped:
        return None
    server = any(command in example.code for command in SERVERS)
    env = {
        **os.environ,
        "PATH": f"{installed.venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
        # what `supabase status -o env` gives a reader (the HTTP worker's settings ask for
        # the service key too), and the wake-up secret they made
        "DB_URL": cluster.dsn(user="postgres"),
        "API_URL": "http://127.0.0.1:54321",
        "SERVICE_ROLE_KEY": make_jwt("service_role"),
        "WAKE_SECRET": "0123456789abcdef" * 4,  # as `openssl rand -hex 32` makes one
    }
    # a server example listens where the docs say (the dashboard on 8080): one at a time
    with SERVER_LOCK.open("w") as lock:
        if server:
            fcntl.flock(lock, fcntl.LOCK_EX)
        proc = subprocess.Popen(
            ["bash", "-e", "-o", "pipefail", "-c", UV + example.first + example.code],
            cwd=installed.path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=UP_FOR if server else 120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            out, err = proc.communicate()
            return None if server else f"{example} did not finish in 120 s:\n{err}"
    if proc.returncode != 0 or "Traceback" in err:
        return (
            f"{example} exited {proc.returncode}:\n{example.first}{example.code}"
            f"--- stdout\n{out}--- stderr\n{err}"
        )
    return f"{example}: the server stopped at once:\n{err}" if server else None


# The one-shot commands are the same code in both styles; the README differs by style.
@pytest.mark.parametrize(
    "installed",
    [variant("python", "postgres"), variant("python-http", "postgres")],
    indirect=True,
    ids=str,
)
def test_the_cli_examples_run(installed: Installed, queue_database: Cluster) -> None:
    found = [e for page in DOC_PAGES for e in cli_examples(page, f"docs/{page.name}")]
    found += cli_examples(installed.path / "README.md", "README.md")
    assert len(found) >= 5, found
    failures = [run_cli_example(installed, queue_database, example) for example in found]
    assert [f for f in failures if f] == []


@pytest.mark.parametrize("installed", [variant("python", "postgres")], indirect=True, ids=str)
def test_a_wrong_cli_example_fails_naming_its_page(
    installed: Installed, queue_database: Cluster
) -> None:
    wrong = Example("docs/x.md", 5, f"{CLI} enqueue-job send_email '{{}}'\n", "")
    failure = run_cli_example(installed, queue_database, wrong)
    assert failure and failure.startswith("docs/x.md:5 exited 2")
