"""Workflows (issue 51) on a real PostgreSQL: a job enqueued with `depends_on` waits (in
waiting_jobs, where no claim sees it) until its dependencies are done, then runs with their
results in its payload under `_dependencies`; a dead-lettered or cancelled dependency cancels
what waits on it, transitively (or, with on_dependency_failure 'run', runs it told which
failed); retry() of a dead-lettered step brings back what its failure cancelled. Completions by
concurrent workers release a fan-in exactly once, and an enqueue racing the completion of its
dependency never leaves it waiting."""

from __future__ import annotations

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from tests.sql.test_hot_path import complete_and_claim
from tests.support.jobs import job_by_id


def enqueue(db: psycopg.Connection, kind: str, *depends_on: int, **kw: object) -> int:
    """enqueue(kind) after the jobs `depends_on`, with the other arguments by name."""
    args = "".join(f", {k} => %({k})s" for k in kw)
    (job_id,) = db.execute(
        f"select pgqueue.enqueue(%(kind)s, depends_on => %(deps)s::bigint[]{args})",
        {"kind": kind, "deps": list(depends_on) or None, **kw},
    ).fetchone()
    return job_id


def status(db: psycopg.Connection, job_id: int) -> str:
    return job_by_id(db, job_id)["status"]


def claim_all(db: psycopg.Connection, max_jobs: int = 100) -> list[dict]:
    return complete_and_claim(db, max_jobs=max_jobs)


def complete(db: psycopg.Connection, job: dict, result: object = None) -> None:
    (done,) = db.execute(
        "select pgqueue.complete(%s, %s, %s)",
        (job["id"], job["lock_token"], None if result is None else Jsonb(result)),
    ).fetchone()
    assert done


def dead_letter(db: psycopg.Connection, job: dict, error: str = "boom") -> None:
    (outcome,) = db.execute(
        "select pgqueue.fail(%s, %s, %s, retryable => false)",
        (job["id"], job["lock_token"], error),
    ).fetchone()
    assert outcome == "failed"


def run(db: psycopg.Connection, results: dict[str, object] | None = None) -> list[dict]:
    """Claims what is runnable and completes it (with results[kind] when given), until
    nothing is; returns the jobs in the order they were claimed."""
    ran = []
    while batch := claim_all(db):
        for job in batch:
            complete(db, job, (results or {}).get(job["kind"]))
        ran += batch
    return ran


def test_a_diamond_runs_in_order_with_its_dependencies_results(db: psycopg.Connection) -> None:
    a = enqueue(db, "a")
    b = enqueue(db, "b", a)
    c = enqueue(db, "c", a)
    d = enqueue(db, "d", b, c, payload=Jsonb({"zip": True}))
    assert [status(db, x) for x in (a, b, c, d)] == ["queued", "waiting", "waiting", "waiting"]
    (first,) = claim_all(db)
    assert first["id"] == a, "only A is claimable"
    complete(db, first, {"from": "a"})
    middle = sorted(claim_all(db), key=lambda j: j["id"])
    assert [j["id"] for j in middle] == [b, c]
    for job in middle:
        assert job["payload"]["_dependencies"] == {
            str(a): {"kind": "a", "status": "done", "result": {"from": "a"}}
        }
    complete(db, middle[0], {"from": "b"})
    assert claim_all(db) == [], "D waits for both"
    assert status(db, d) == "waiting"
    complete(db, middle[1], None)  # no result: kept in the history all the same
    (last,) = claim_all(db)
    assert last["id"] == d
    assert last["payload"] == {
        "zip": True,
        "_dependencies": {
            str(b): {"kind": "b", "status": "done", "result": {"from": "b"}},
            str(c): {"kind": "c", "status": "done", "result": None},
        },
    }
    view = job_by_id(db, d)
    assert view["depends_on"] == [
        {"id": b, "kind": "b", "status": "done"},
        {"id": c, "kind": "c", "status": "done"},
    ]
    assert view["workflow_id"] == a
    assert job_by_id(db, a)["dependents"] == [
        {"id": b, "kind": "b", "status": "done"},
        {"id": c, "kind": "c", "status": "done"},
    ]
    with db.cursor(row_factory=dict_row) as cur:
        drawn = cur.execute("select * from pgqueue.workflow(%s)", (c,)).fetchall()
    assert [(r["id"], r["status"], r["depends_on"]) for r in drawn] == [
        (a, "done", []),
        (b, "done", [a]),
        (c, "done", [a]),
        (d, "running", [b, c]),
    ]
