"""Workflows through real Python workers: each built with the project's own Workflow and
enqueued by its queue client (workflow_enqueue.py, under the project's interpreter), its steps
run by worker processes (the e2e_step handler, tests/support/handlers/e2e_workflow.py), which
record what job.dependencies handed them. Shown: each step runs once, after its
dependencies ended; a dependent receives their results (fetched when the queue left them out
of its payload); a failed step cancels what waits on it, 'run' is honoured, and a retry of the
failed step lets its dependents run."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import psycopg
import pytest

from testkit.project import PYTHON_VARIANTS, variant
from tests.support import step_order
from tests.support.jobs import wait_until
from tests.support.workers import Installed, Workers, each_transport

ENQUEUE = Path(__file__).parent / "workflow_enqueue.py"


def enqueue_workflow(
    installed: Installed, env: dict, shape: str, log: Path, *extra: str
) -> dict[str, int]:
    """{step name: job id} of the workflow `shape`, enqueued in one call by the project."""
    proc = subprocess.run(
        [installed.bin("python"), ENQUEUE, shape, str(log), *extra],
        env={**os.environ, **env, "PYTHONPATH": str(installed.src)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def statuses(db: psycopg.Connection, ids: dict[str, int]) -> dict[str, tuple[str, str | None]]:
    rows = dict(
        (row[0], (row[1], row[2]))
        for row in db.execute(
            "select id, status, last_error from pgqueue.all_jobs where id = any(%s)",
            (list(ids.values()),),
        )
    )
    return {name: rows.get(job_id, ("missing", None)) for name, job_id in ids.items()}


def until_finished(db: psycopg.Connection, ids: dict[str, int], timeout: float = 60) -> dict:
    """{name: (status, last_error)} once every step is done, failed or cancelled."""

    def finished() -> dict | None:
        now = statuses(db, ids)
        return now if all(s in ("done", "failed", "cancelled") for s, _ in now.values()) else None

    return wait_until(finished, timeout=timeout, what="every step to finish")


def runs(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def check_order(
    log: Path, ids: dict[str, int], waits_on: dict[str, list[str]], reran: frozenset = frozenset()
) -> dict:
    """step_order.check_order() over the lines the e2e_step handler wrote to `log`."""
    return step_order.check_order(runs(log), ids, waits_on, reran)


@pytest.mark.parametrize("installed", PYTHON_VARIANTS, indirect=True, ids=str)
def test_a_diamond_and_a_chain_run_in_order_with_results(
    installed: Installed,
    workers: Workers,
    worker_env: dict,
    db: psycopg.Connection,
    wake_secret: str,
    tmp_path: Path,
) -> None:
    workers.start_woken(db, wake_secret)
    workers.start_woken(db, wake_secret)
    log = tmp_path / "runs.jsonl"
    # the postgres transport's projects have psycopg: there, in the app's own transaction
    how = ["in-transaction"] if installed.transport == "postgres" else []
    diamond = enqueue_workflow(installed, worker_env, "diamond", log, *how)
    chain = enqueue_workflow(installed, worker_env, "chain", log)

    both = {**diamond, **chain}
    assert set(until_finished(db, both).values()) == {("done", None)}
    waits_on = {"A": [], "B": ["A"], "C": ["A"], "D": ["B", "C"]}
    waits_on |= {f"s{n}": [f"s{n - 1}"] if n else [] for n in range(10)}
    ends = check_order(log, both, waits_on)
    # D received B's and C's results (by kind, in id order), and by id their statuses; its
    # payload no longer holds them
    assert ends["D"]["after"] == ["B", "C"]
    assert ends["D"]["dependencies"] == {
        str(diamond[name]): {"kind": "e2e_step", "status": "done", "error": None}
        for name in ("B", "C")
    }
    assert ends["D"]["payload_keys"] == ["fail_unless", "log", "name", "pad"]
    assert ends["A"]["dependencies"] == {} and not ends["D"]["omitted"]
    assert [ends[f"s{n}"]["after"] for n in range(10)] == [[]] + [[f"s{n}"] for n in range(9)]


@pytest.mark.parametrize("installed", [variant("python", "postgres")], indirect=True, ids=str)
def test_a_fan_in_of_a_thousand_runs_once_with_every_result(
    installed: Installed,
    workers: Workers,
    worker_env: dict,
    db: psycopg.Connection,
    wake_secret: str,
    tmp_path: Path,
) -> None:
    for _ in range(4):
        workers.start_woken(db, wake_secret, WORKER_CONCURRENCY=16)
    log = tmp_path / "runs.jsonl"
    ids = enqueue_workflow(installed, worker_env, "fanin", log)

    assert set(until_finished(db, ids, timeout=180).values()) == {("done", None)}
    children = [f"c{n}" for n in range(1000)]
    ends = check_order(log, ids, {"zip": children})
    zipped = ends["zip"]
    # 2 MB of results: the queue left them out of the payload, the worker fetched them
    assert zipped["omitted"] is True
    assert zipped["after"] == children  # in id order, which is step order
    assert len(zipped["dependencies"]) == 1000


@each_transport
def test_a_failed_step_cancels_its_dependents_and_a_retry_resumes_them(
    installed: Installed,
    workers: Workers,
    worker_env: dict,
    db: psycopg.Connection,
    wake_secret: str,
    tmp_path: Path,
) -> None:
    workers.start_woken(db, wake_secret)
    log, marker = tmp_path / "runs.jsonl", tmp_path / "may-succeed"
    ids = enqueue_workflow(installed, worker_env, "failure", log, str(marker))

    ended = until_finished(db, ids)
    assert ended["A"] == ("failed", "step A failed")
    assert ended["B"] == ("cancelled", f"dependency {ids['A']} was dead-lettered: step A failed")
    assert ended["C"][0] == "cancelled" and f"dependency {ids['B']}" in str(ended["C"][1])
    assert ended["R"] == ("done", None)
    ends = check_order(log, ids, {})
    told = ends["R"]["dependencies"][str(ids["A"])]
    assert told == {"kind": "e2e_step", "status": "failed", "error": "step A failed"}
    assert ends["R"]["after"] == []  # no done dependency: no result
    assert {line["name"] for line in runs(log)} == {"A", "R"}

    marker.touch()
    assert db.execute("select pgqueue.retry(%s)", (ids["A"],)).fetchone() == (True,)
    again = {name: ids[name] for name in ("A", "B", "C")}
    # (A keeps its failed attempt's error as its last_error)
    assert {status for status, _ in until_finished(db, again).values()} == {"done"}
    ends = check_order(log, ids, {"B": ["A"], "C": ["B"]}, reran=frozenset("A"))
    assert ends["C"]["after"] == ["B"]
    assert statuses(db, {"R": ids["R"]}) == {"R": ("done", None)}  # not run again
