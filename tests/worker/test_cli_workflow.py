"""What the CLI shows of a workflow (issue 51), against a real database holding a diamond (A ->
B, A -> C, B and C -> D) enqueued through the SQL: `job ID` names what a job waits for, what
waits for it and its workflow; `workflow ID` prints every step, from any of its jobs, with
what it waits for and its result or error; dead letters called so, as elsewhere."""

from __future__ import annotations

import json
import os
import subprocess

import psycopg

from tests.support.diamond import C_ERROR, KINDS, RESULTS, enqueue_diamond, finish_diamond
from tests.support.workers import SCRIPT, Installed, each_transport


def ok(installed: Installed, env: dict, *args: str) -> str:
    done = subprocess.run(
        [installed.bin(SCRIPT), *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def steps(installed: Installed, env: dict, job_id: int) -> list[dict]:
    return [json.loads(line) for line in ok(installed, env, "workflow", str(job_id)).splitlines()]


@each_transport
def test_job_and_workflow_show_a_diamond(
    installed: Installed, stack_env: dict, db: psycopg.Connection
) -> None:
    wf = enqueue_diamond(db)
    d = json.loads(ok(installed, stack_env, "job", str(wf.d)))
    assert (d["status"], d["workflow_id"], d["dependents"]) == ("waiting", wf.a, [])
    assert d["depends_on"] == [
        {"id": wf.b, "kind": KINDS["b"], "status": "queued"},
        {"id": wf.c, "kind": KINDS["c"], "status": "queued"},
    ]
    a = json.loads(ok(installed, stack_env, "job", str(wf.a)))
    assert (a["status"], a["result"], a["workflow_id"], a["depends_on"]) == (
        "done",
        RESULTS["a"],
        wf.a,
        [],
    )
    assert [(j["id"], j["status"]) for j in a["dependents"]] == [(wf.b, "queued"), (wf.c, "queued")]

    # from any of its jobs: every step, in id order, with what it waits for
    shown = steps(installed, stack_env, wf.c)
    assert [(s["id"], s["kind"], s["status"], s["depends_on"]) for s in shown] == [
        (wf.a, KINDS["a"], "done", []),
        (wf.b, KINDS["b"], "queued", [wf.a]),
        (wf.c, KINDS["c"], "queued", [wf.a]),
        (wf.d, KINDS["d"], "waiting", [wf.b, wf.c]),
    ]
    assert shown[0]["result"] == RESULTS["a"] and shown[3]["result"] is None

    finish_diamond(db)
    shown = steps(installed, stack_env, wf.a)
    assert [s["status"] for s in shown] == ["done", "done", "dead-lettered", "cancelled"]
    assert shown[1]["result"] == RESULTS["b"]
    assert shown[2]["last_error"] == C_ERROR
    assert shown[3]["last_error"].startswith(f"dependency {wf.c} was dead-lettered: ")
    d = json.loads(ok(installed, stack_env, "job", str(wf.d)))
    assert [(j["id"], j["status"]) for j in d["depends_on"]] == [
        (wf.b, "done"),
        (wf.c, "dead-lettered"),
    ]


@each_transport
def test_a_job_in_no_workflow_is_a_workflow_of_one(
    installed: Installed, stack_env: dict, db: psycopg.Connection
) -> None:
    (job_id,) = db.execute("select pgqueue.enqueue('send_email')").fetchone()
    shown = json.loads(ok(installed, stack_env, "job", str(job_id)))
    assert (shown["depends_on"], shown["dependents"], shown["workflow_id"]) == ([], [], None)
    [step] = steps(installed, stack_env, job_id)
    assert (step["id"], step["status"], step["depends_on"]) == (job_id, "queued", [])
