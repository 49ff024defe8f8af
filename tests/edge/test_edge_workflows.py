"""Workflows through the Edge Function: each built with the function's own Workflow and
enqueued by its queue client (workflow_enqueue.ts), its steps run by the function (its own
index.ts under `deno run`, woken through pg_net), whose `step` handler (workflow_step.ts) logs
what job.dependencies handed it. Shown: each step runs once, after its dependencies ended; a
dependent receives their results (fetched when the queue left them out of its payload); a
failed step cancels what waits on it, "run" is honoured, and a retry of the failed step lets
its dependents run. And docs/workflows.md's Edge example, run as written."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from testkit.postgrest import PostgRESTStandIn, make_jwt
from testkit.project import REPO
from testkit.stack import point_wake_ups
from tests.support import step_order
from tests.support.doc_examples import examples
from tests.support.http_sink import HttpSink
from tests.support.jobs import job_by_id, wait_until

from .deno_worker import (
    EDGE_WAKE_SECRET,
    FUNCTION,
    Deno,
    EdgeWorker,
    register_handler,
    start_edge_worker,
    stop_edge_worker,
)

HERE = Path(__file__).parent
DOC = REPO / "docs" / "workflows.md"
# what docs/workflows.md says its example's album job returns
ALBUM_RESULT = ["summer: beach.jpg@64w", "summer: beach.jpg@1024w"]


def doc_module() -> str:
    """docs/workflows.md's Edge example: the one ```ts block of the page that defines kinds."""
    [example] = [e for e in examples(DOC, "docs/workflows.md", "ts") if "defineKind" in e.code]
    return example.code


@pytest.fixture(scope="module")
def workflow_function(function_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the rendered function (beside the docs' _shared/album.ts) with the `step`
    kind and the docs' `resize` and `album` registered, and the enqueuer next to queue.ts."""
    functions = tmp_path_factory.mktemp("workflows") / "functions"
    copy = functions / FUNCTION
    shutil.copytree(function_dir, copy)
    (functions / "_shared").mkdir()
    (functions / "_shared" / "album.ts").write_text(doc_module())
    shutil.copy(HERE / "workflow_step.ts", copy / "handlers" / "workflow_step.ts")
    shutil.copy(HERE / "workflow_enqueue.ts", copy / "workflow_enqueue.ts")
    register_handler(
        copy, 'import { workflowStep } from "./workflow_step.ts";', "step: workflowStep"
    )
    register_handler(
        copy, 'import { album, resize } from "../../_shared/album.ts";', "album, resize"
    )
    return copy


@pytest.fixture(scope="module")
def worker(
    deno: Deno, workflow_function: Path, postgrest: PostgRESTStandIn
) -> Iterator[EdgeWorker]:
    started = start_edge_worker(deno, workflow_function, postgrest, PGQUEUE_LOG_LEVEL="debug")
    yield started
    stop_edge_worker(started)


@dataclass
class Woken:
    """The module's worker, woken by this test's jobs; `since`: its lines before the test (job
    ids start again in each test's database, so only this test's lines count)."""

    worker: EdgeWorker
    since: int

    def events(self) -> list[dict]:
        return [json.loads(line) for line in self.worker.lines[self.since :] if line[:1] == "{"]


@pytest.fixture
def woken(db: psycopg.Connection, worker: EdgeWorker) -> Woken:
    point_wake_ups(db, worker.url, worker.wake_secret)
    return Woken(worker, len(worker.lines))


def enqueue_workflow(
    deno: Deno, function: Path, api: PostgRESTStandIn, *args: str
) -> dict[str, int]:
    proc = subprocess.run(
        [deno.binary, "run", "--allow-net=127.0.0.1", "--allow-env", "workflow_enqueue.ts", *args],
        cwd=function,
        env=deno.env(
            SUPABASE_URL=api.url,
            SUPABASE_SERVICE_ROLE_KEY=make_jwt("service_role"),
            PGQUEUE_WAKE_SECRET=EDGE_WAKE_SECRET,
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def statuses(db: psycopg.Connection, ids: dict[str, int]) -> dict[str, tuple[str, str | None]]:
    rows = {
        row[0]: (row[1], row[2])
        for row in db.execute(
            "select id, status, last_error from pgqueue.all_jobs where id = any(%s)",
            (list(ids.values()),),
        )
    }
    return {name: rows.get(job_id, ("missing", None)) for name, job_id in ids.items()}


def until_finished(
    db: psycopg.Connection, ids: dict[str, int], woken: Woken, timeout: float = 60
) -> dict:
    def finished() -> dict | None:
        now = statuses(db, ids)
        return now if all(s in ("done", "failed", "cancelled") for s, _ in now.values()) else None

    try:
        return wait_until(finished, timeout=timeout, what="every step to finish")
    except BaseException:
        print(statuses(db, ids), woken.worker.output()[-5000:])
        raise


def check_order(
    woken: Woken,
    ids: dict[str, int],
    waits_on: dict[str, list[str]],
    reran: frozenset = frozenset(),
) -> dict:
    """step_order.check_order() over the step.start and step.end lines of the steps of `ids`
    in the worker's log."""
    mine = set(ids.values())
    records = [
        {**e, "at": e["event"].removeprefix("step."), "job_id": e["jobId"]}
        for e in woken.events()
        if e.get("jobId") in mine and e["event"] in ("step.start", "step.end")
    ]
    return step_order.check_order(records, ids, waits_on, reran)


def test_a_diamond_and_a_chain_run_in_order_with_results(
    deno: Deno,
    workflow_function: Path,
    postgrest: PostgRESTStandIn,
    db: psycopg.Connection,
    woken: Woken,
) -> None:
    diamond = enqueue_workflow(deno, workflow_function, postgrest, "diamond")
    chain = enqueue_workflow(deno, workflow_function, postgrest, "chain")
    both = {**diamond, **chain}
    assert set(until_finished(db, both, woken).values()) == {("done", None)}
    waits_on = {"A": [], "B": ["A"], "C": ["A"], "D": ["B", "C"]}
    waits_on |= {f"s{n}": [f"s{n - 1}"] if n else [] for n in range(10)}
    ends = check_order(woken, both, waits_on)
    assert ends["D"]["after"] == ["B", "C"]
    assert ends["D"]["dependencies"] == {
        str(diamond[name]): {"kind": "step", "status": "done", "error": None} for name in "BC"
    }
    assert ends["A"]["dependencies"] == {} and not ends["D"]["omitted"]
    assert [ends[f"s{n}"]["after"] for n in range(10)] == [[]] + [[f"s{n}"] for n in range(9)]


def test_a_fan_in_of_a_thousand_runs_once_with_every_result(
    deno: Deno,
    workflow_function: Path,
    postgrest: PostgRESTStandIn,
    db: psycopg.Connection,
    woken: Woken,
) -> None:
    ids = enqueue_workflow(deno, workflow_function, postgrest, "fanin")
    assert set(until_finished(db, ids, woken, timeout=180).values()) == {("done", None)}
    children = [f"c{n}" for n in range(1000)]
    zipped = check_order(woken, ids, {"zip": children})["zip"]
    assert zipped["omitted"] is True  # 2 MB of results: fetched, not in the payload
    assert zipped["after"] == children
    assert len(zipped["dependencies"]) == 1000


def test_a_failed_step_cancels_its_dependents_and_a_retry_resumes_them(
    deno: Deno,
    workflow_function: Path,
    postgrest: PostgRESTStandIn,
    db: psycopg.Connection,
    woken: Woken,
) -> None:
    with HttpSink(status=503) as upstream:  # what A's first attempt finds
        ids = enqueue_workflow(deno, workflow_function, postgrest, "failure", upstream.url)
        ended = until_finished(db, ids, woken)
        assert ended["A"][0] == "failed" and "step A failed" in str(ended["A"][1])
        assert ended["B"][0] == "cancelled"
        assert str(ended["B"][1]).startswith(f"dependency {ids['A']} was dead-lettered: ")
        assert "step A failed" in str(ended["B"][1])
        assert ended["C"][0] == "cancelled" and f"dependency {ids['B']}" in str(ended["C"][1])
        assert ended["R"] == ("done", None)
        told = check_order(woken, ids, {})["R"]["dependencies"][str(ids["A"])]
        assert told["status"] == "failed" and "step A failed" in told["error"]

        upstream.status = 200
        assert db.execute("select pgqueue.retry(%s)", (ids["A"],)).fetchone() == (True,)
        again = {name: ids[name] for name in "ABC"}
        # (A keeps its failed attempt's error as its last_error)
        assert {status for status, _ in until_finished(db, again, woken).values()} == {"done"}
    ends = check_order(woken, ids, {"B": ["A"], "C": ["B"]}, reran=frozenset("A"))
    assert ends["C"]["after"] == ["B"]


def test_the_docs_edge_example_runs_as_written(
    deno: Deno,
    workflow_function: Path,
    postgrest: PostgRESTStandIn,
    db: psycopg.Connection,
    woken: Woken,
) -> None:
    assert json.dumps(ALBUM_RESULT) in DOC.read_text().replace("\n", " ")
    album = enqueue_workflow(deno, workflow_function, postgrest, "album")["album"]
    until_finished(db, {"album": album}, woken)
    assert job_by_id(db, album)["result"] == ALBUM_RESULT, job_by_id(db, album)
