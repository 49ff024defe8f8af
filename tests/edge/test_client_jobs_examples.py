"""docs/client-jobs.md's TypeScript examples run as written, with the Edge Function: its
export_data handler registered in a copy of the rendered function (`deno run`, pointed at the
Data API stand-in), and its supabase-js example, run by Deno as a signed-in user with their
JWT, submits a job of that kind and follows it in my_jobs until it is done; the handler saw the
user as job.owner. A job the service enqueued has no owner: the handler's UserFacingError is
stored as its message alone, without a stack."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path

import psycopg
import pytest

from testkit.postgrest import PostgRESTStandIn, make_jwt
from testkit.project import REPO
from testkit.stack import point_wake_ups
from tests.support.doc_examples import Example, examples
from tests.support.jobs import enqueue, job, wait_until

from .deno_worker import FUNCTION, Deno, register_handler, start_edge_worker, stop_edge_worker

PAGE = REPO / "docs" / "client-jobs.md"


def page_example(containing: str) -> Example:
    [found] = [
        e
        for e in examples(PAGE, "docs/client-jobs.md", "ts")
        if containing in e.code and not e.skipped
    ]
    return found


@pytest.fixture(scope="module")
def export_function(function_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the rendered function with the page's export_data handler registered, as the
    page says: handlers/export_data.ts, and a line in handlers/mod.ts."""
    copy = tmp_path_factory.mktemp("export") / FUNCTION
    shutil.copytree(function_dir, copy)
    handler = page_example("defineHandler(")
    imports = handler.first.replace("../job-worker/job.ts", "../job.ts")
    (copy / "handlers" / "export_data.ts").write_text(imports + handler.code)
    register_handler(
        copy, 'import { exportData } from "./export_data.ts";', "export_data: exportData"
    )
    return copy


def test_the_pages_supabase_js_example_follows_the_pages_handler_to_the_end(
    deno: Deno,
    export_function: Path,
    postgrest: PostgRESTStandIn,
    app_api: PostgRESTStandIn,
    db: psycopg.Connection,
    export_open: psycopg.Connection,
    tmp_path: Path,
) -> None:
    worker = start_edge_worker(deno, export_function, postgrest, PGQUEUE_LINGER_MS="0")
    try:
        point_wake_ups(db, worker.url, worker.wake_secret)
        client = page_example("client_enqueue")
        # in the function's folder, so that its deno.json maps "@supabase/supabase-js"
        script = export_function / "client_example.ts"
        script.write_text(client.first + client.code)
        user = uuid.uuid4()
        env = deno.env(
            SUPABASE_URL=app_api.url,
            SUPABASE_ANON_KEY=make_jwt("anon"),
            USER_ACCESS_TOKEN=make_jwt("authenticated", sub=str(user)),
        )
        proc = subprocess.run(
            [deno.binary, "run", "--allow-net=127.0.0.1", "--allow-env", str(script)],
            cwd=export_function,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, f"{proc.stderr}\n--- worker\n{worker.output()}"
        # The job ran as the user's: the handler's result names its owner.
        assert f'done {{ file: "exports/{user}/' in proc.stdout, proc.stdout

        # A job the service enqueued has no owner: the handler refuses it with the message
        # alone as its error (no stack), and no retry.
        service_job = enqueue(db, kind="export_data")
        failed = wait_until(
            lambda: (row := job(db, service_job))["status"] == "failed" and row,
            what="the service's export_data job to fail",
        )
        assert failed["attempts"] == 1
        assert failed["last_error"] == "UserFacingError: an export is made for a signed-in user"
    finally:
        stop_edge_worker(worker)
