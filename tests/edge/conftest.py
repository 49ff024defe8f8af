"""Fixtures for the Edge Function worker: Deno, a rendered edge project, and the function
itself under `deno run`, talking to the PostgREST stand-in (tests/conftest.py)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from deno import find_deno_bin

from testkit.postgrest import PostgRESTStandIn
from testkit.project import render

from .deno_worker import (
    FUNCTION,
    Deno,
    EdgeWorker,
    register_handler,
    start_edge_worker,
    stop_edge_worker,
)


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
def probe_function_dir(function_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the rendered function with the `probe` job kind (probe.ts) registered, and
    the queue client's runner (queue_client.ts) next to its queue.ts."""
    copy = tmp_path_factory.mktemp("probe") / FUNCTION
    shutil.copytree(function_dir, copy)
    here = Path(__file__).parent
    shutil.copy(here / "probe.ts", copy / "handlers" / "probe.ts")
    shutil.copy(here / "queue_client.ts", copy / "queue_client.ts")
    register_handler(copy, 'import { probe } from "./probe.ts";', "probe")
    return copy


@pytest.fixture(scope="module")
def edge_worker(
    deno: Deno, function_dir: Path, postgrest: PostgRESTStandIn
) -> Iterator[EdgeWorker]:
    # These tests check what each wake-up does, so no drain may outlive its test and run the
    # next test's jobs: the linger is off here (test_edge_linger.py tests it). They read which
    # jobs it ran from its per-job log lines, written at "debug".
    worker = start_edge_worker(
        deno, function_dir, postgrest, PGQUEUE_LINGER_MS="0", PGQUEUE_LOG_LEVEL="debug"
    )
    yield worker
    stop_edge_worker(worker)
