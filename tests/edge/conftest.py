"""Fixtures for the Edge Function worker: Deno, a rendered edge project, the PostgREST
stand-in in front of the test stack, and the function itself under `deno run`."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from deno import find_deno_bin

from testkit.cluster import Cluster
from testkit.postgrest import PostgRESTStandIn
from testkit.project import render

from .deno_worker import FUNCTION, Deno, EdgeWorker, start_edge_worker, stop_edge_worker


@pytest.fixture(scope="session")
def deno(tmp_path_factory: pytest.TempPathFactory) -> Deno:
    """Deno, with npm packages cached once per session (or in $DENO_DIR when it is set)."""
    cache = os.environ.get("DENO_DIR") or tmp_path_factory.mktemp("deno-cache")
    return Deno(find_deno_bin(), Path(cache))


@pytest.fixture(scope="session")
def edge_project(template: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project rendered with worker_style=edge and otherwise default answers."""
    return render(template, tmp_path_factory.mktemp("edge") / "edge-app", worker_style="edge")


@pytest.fixture(scope="session")
def function_dir(edge_project: Path) -> Path:
    return edge_project / "supabase" / "functions" / FUNCTION


@pytest.fixture(scope="session")
def postgrest(stack: Cluster, project: Path) -> Iterator[PostgRESTStandIn]:
    """The Data API (RPC) over the test stack, whose queue the default project migrated."""
    with PostgRESTStandIn(stack.dsn()) as api:
        yield api


@pytest.fixture(scope="module")
def edge_worker(
    deno: Deno, function_dir: Path, postgrest: PostgRESTStandIn
) -> Iterator[EdgeWorker]:
    worker = start_edge_worker(deno, function_dir, postgrest)
    yield worker
    stop_edge_worker(worker)
