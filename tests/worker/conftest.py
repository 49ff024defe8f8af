"""Fixtures for the Python worker's tests: each variant installed (tests/conftest.py's
`installs`), and worker processes that are killed whatever happens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.cluster import Cluster
from testkit.project import PYTHON_VARIANTS, Variant
from testkit.stack import notify_listeners
from tests.support.workers import Installed, Workers


@pytest.fixture(params=PYTHON_VARIANTS, ids=str)
def installed(
    request: pytest.FixtureRequest, installs: dict, stack_env: dict, stack: Cluster
) -> Iterator[Installed]:
    """A rendered variant installed in its own venv (parametrized over all of them). Asks
    for the stack after `installs`, so the stack starts while uv runs. While the variant is
    under test, the database sends NOTIFY as the variant's own project would have it seeded
    (config.notify_listeners: on for the postgres transport, whose workers LISTEN)."""
    variant: Variant = request.param
    with notify_listeners(stack, variant.claim_transport == "postgres"):
        yield installs[variant].result()


@pytest.fixture
def workers(installed: Installed, worker_env: dict, tmp_path: Path) -> Iterator[Workers]:
    """Starts worker processes of the variant under test (quick polling, 4 jobs at once)."""
    env = {
        **worker_env,
        "WORKER_POLL_INTERVAL": "0.5",
        "WORKER_CONCURRENCY": "4",
        "WORKER_SHUTDOWN_GRACE": "10",
    }
    pool = Workers(installed, env, tmp_path)
    yield pool
    pool.kill_all()
