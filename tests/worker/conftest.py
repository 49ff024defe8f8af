"""Fixtures for the Python worker's tests: each variant rendered and installed in a venv
(once per session, all variants in parallel), the stack under the names a project reads, and
worker processes that are killed whatever happens."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from testkit.cluster import Cluster
from testkit.postgrest import PostgRESTStandIn, make_jwt
from testkit.project import PYTHON_VARIANTS, Variant
from tests.support.workers import Installed, Workers, install


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


@pytest.fixture(params=PYTHON_VARIANTS, ids=str)
def installed(request: pytest.FixtureRequest, installs: dict, stack_env: dict) -> Installed:
    """A rendered variant installed in its own venv (parametrized over all of them). Asks
    for the stack after `installs`, so the stack starts while uv runs."""
    return installs[request.param].result()


@pytest.fixture(scope="session")
def service_role_key() -> str:
    return make_jwt("service_role")


@pytest.fixture(scope="session")
def stack_env(stack: Cluster, postgrest: PostgRESTStandIn, service_role_key: str) -> dict:
    """Our stack under the names `supabase status -o env` prints, which projects read."""
    return {"API_URL": postgrest.url, "SERVICE_ROLE_KEY": service_role_key, "DB_URL": stack.dsn()}


@pytest.fixture
def workers(installed: Installed, stack_env: dict, tmp_path: Path) -> Iterator[Workers]:
    """Starts worker processes of the variant under test (quick polling, 4 jobs at once)."""
    env = {
        **stack_env,
        "WORKER_POLL_INTERVAL": "0.5",
        "WORKER_CONCURRENCY": "4",
        "WORKER_SHUTDOWN_GRACE": "10",
    }
    pool = Workers(installed, env, tmp_path)
    yield pool
    pool.kill_all()
