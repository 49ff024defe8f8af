"""Workflows (issue 51) on a real PostgreSQL: a job enqueued with `depends_on` waits (in
waiting_jobs, where no claim sees it) until its dependencies are done, then runs with their
results in its payload under `_dependencies`; a dead-lettered or cancelled dependency cancels
what waits on it, transitively (or, with on_dependency_failure 'run', runs it told which
failed); retry() of a dead-lettered step brings back what its failure cancelled. Completions by
concurrent workers release a fan-in exactly once, and an enqueue racing the completion of its
dependency never leaves it waiting."""

from __future__ import annotations

import json
import random
import re
import threading
import uuid
from collections import Counter
from functools import partial

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from testkit.cluster import Cluster
from testkit.plans import plans_logged
from testkit.project import REPO
from tests.sql.test_hot_path import complete_and_claim
from tests.support.jobs import job_by_id

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


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


def test_a_chain_of_ten_runs_one_step_at_a_time_each_given_the_last_result(
    db: psycopg.Connection,
) -> None:
    chain = [enqueue(db, "step", payload=Jsonb({"n": 0}))]
    for n in range(1, 10):
        chain.append(enqueue(db, "step", chain[-1], payload=Jsonb({"n": n})))
    for n, job_id in enumerate(chain):
        (job,) = claim_all(db)
        assert job["id"] == job_id, f"step {n} runs alone, in order"
        if n:
            assert job["payload"]["_dependencies"] == {
                str(chain[n - 1]): {"kind": "step", "status": "done", "result": n - 1}
            }
        complete(db, job, n)
    assert claim_all(db) == []
    assert db.execute("select count(*) from pgqueue.waiting_jobs").fetchone() == (0,)
    assert {status(db, x) for x in chain} == {"done"}


def test_a_fan_in_of_1000_runs_once_when_its_last_child_is_done_under_4_completers(
    db: psycopg.Connection, stack: Cluster
) -> None:
    children = [
        r[0]
        for r in db.execute(
            "select pgqueue.enqueue_many(%s)",
            (Jsonb([{"kind": "child", "payload": {"n": n}} for n in range(1000)]),),
        )
    ]
    fan_in = enqueue(db, "fan_in", *children)
    assert job_by_id(db, fan_in)["status"] == "waiting"
    claimed: Counter[int] = Counter()
    fan_ins: list[dict] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def completer() -> None:
        try:
            with stack.connect(autocommit=True) as conn:
                batch: list[dict] = []
                while True:
                    # each child completes with its number as its result
                    results = [Jsonb(j["payload"].get("n")) for j in batch]
                    with conn.cursor(row_factory=dict_row) as cur:
                        nxt = cur.execute(
                            "select * from pgqueue.complete_and_claim('w', %s::bigint[],"
                            " %s::uuid[], 7, done_results => %s::jsonb[])",
                            ([j["id"] for j in batch], [j["lock_token"] for j in batch], results),
                        ).fetchall()
                    with lock:
                        claimed.update(j["id"] for j in nxt)
                        fan_ins.extend(j for j in nxt if j["kind"] == "fan_in")
                    if not batch and not nxt:
                        return
                    batch = [j for j in nxt if j["kind"] == "child"]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=completer) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors
    assert claimed == Counter([*children, fan_in]), "each job claimed once, the fan-in too"
    (job,) = fan_ins
    deps = job["payload"]["_dependencies"]
    assert len(deps) == 1000
    # built when it became runnable: every child done by then, with its result
    assert all(
        deps[str(c)] == {"kind": "child", "status": "done", "result": n}
        for n, c in enumerate(children)
    )
    assert db.execute("select count(*) from pgqueue.waiting_jobs").fetchone() == (0,)


def test_results_that_would_pass_the_payload_limit_are_left_for_dependency_results(
    db: psycopg.Connection,
) -> None:
    parts = [enqueue(db, "part") for _ in range(20)]
    whole = enqueue(db, "whole", *parts)
    rng = random.Random(51)
    big = {p: "".join(rng.choices("abcdefghij", k=60_000)) for p in parts}
    for job in claim_all(db):
        complete(db, job, big[job["id"]])
    (job,) = claim_all(db)
    assert job["id"] == whole
    assert job["payload"]["_dependencies"] == {
        str(p): {"kind": "part", "status": "done", "results_omitted": True} for p in parts
    }
    with db.cursor(row_factory=dict_row) as cur:
        fetched = cur.execute("select * from pgqueue.dependency_results(%s)", (whole,)).fetchall()
    assert fetched == [
        {"id": p, "kind": "part", "status": "done", "result": big[p], "error": None} for p in parts
    ]


def test_a_dead_letter_cancels_its_dependents_transitively_and_run_ones_run_told(
    db: psycopg.Connection,
) -> None:
    a = enqueue(db, "a")
    b = enqueue(db, "b", a)
    c = enqueue(db, "c", b)
    told = enqueue(db, "cleanup", a, b, on_dependency_failure="run")
    (job,) = claim_all(db)
    dead_letter(db, job, "KeyError: 'x'")
    assert job_by_id(db, b)["status"] == "cancelled"
    assert job_by_id(db, b)["last_error"] == f"dependency {a} was dead-lettered: KeyError: 'x'"
    assert job_by_id(db, c)["status"] == "cancelled"
    assert job_by_id(db, c)["last_error"] == f"dependency {b} was cancelled"
    (cleanup,) = claim_all(db)
    assert cleanup["id"] == told
    assert cleanup["payload"]["_dependencies"] == {
        str(a): {"kind": "a", "status": "failed", "error": "KeyError: 'x'", "result": None},
        str(b): {
            "kind": "b",
            "status": "cancelled",
            "error": f"dependency {a} was dead-lettered: KeyError: 'x'",
            "result": None,
        },
    }
    # a job enqueued after its dependency failed is cancelled at once, or runs with 'run'
    late = enqueue(db, "late", a)
    assert (status(db, late), job_by_id(db, late)["last_error"]) == (
        "cancelled",
        f"dependency {a} was dead-lettered: KeyError: 'x'",
    )
    assert status(db, enqueue(db, "late", c, on_dependency_failure="run")) == "queued"


def test_enqueue_many_stores_a_workflow_as_enqueue_would_each_job(
    db: psycopg.Connection,
) -> None:
    """One call's elements, stored together: one with a key (the key's job again on a second
    call), one cancelled at once by a dead letter it depends on, one cancelled with it in turn,
    one with 'run' released told which was cancelled, one runnable at once with a done
    dependency's result, one left waiting for two elements of the call; a bad element's error
    is enqueue()'s, and stores nothing."""
    dead = enqueue(db, "dead")
    (job,) = claim_all(db)
    dead_letter(db, job, "gone")
    done = enqueue(db, "done")
    enqueue(db, "holder", done)  # (so done's result is kept)
    (job,) = claim_all(db)
    complete(db, job, {"n": 1})
    elements = [
        {"kind": "keyed", "idempotency_key": "k1", "traceparent": TRACEPARENT},
        {"kind": "a", "depends_on": [dead]},
        {"kind": "b", "depends_on_index": [1]},
        {"kind": "told", "depends_on_index": [1], "on_dependency_failure": "run"},
        {"kind": "ready", "depends_on": [done], "priority": 3, "traceparent": TRACEPARENT},
        {"kind": "waits", "depends_on_index": [0, 4], "payload": {"x": 1}},
    ]
    ids = [i for (i,) in db.execute("select pgqueue.enqueue_many(%s)", (Jsonb(elements),))]
    keyed, a, b, told, ready, waits = ids
    assert [status(db, i) for i in ids] == [
        "queued",
        "cancelled",
        "cancelled",
        "queued",
        "queued",
        "waiting",
    ]
    assert job_by_id(db, a)["last_error"] == f"dependency {dead} was dead-lettered: gone"
    assert job_by_id(db, b)["last_error"] == f"dependency {a} was cancelled"
    assert db.execute(
        "select id, priority, trace_context::text from pgqueue.jobs where kind <> 'holder' "
        "order by id"
    ).fetchall() == [(keyed, 0, TRACEPARENT), (told, 0, None), (ready, 3, TRACEPARENT)]
    jobs = {j["kind"]: j for j in claim_all(db)}
    assert jobs["told"]["payload"]["_dependencies"] == {
        str(a): {"kind": "a", "status": "cancelled", "error": job_by_id(db, a)["last_error"],
                 "result": None}
    }  # fmt: skip
    assert jobs["ready"]["payload"]["_dependencies"] == {
        str(done): {"kind": "done", "status": "done", "result": {"n": 1}}
    }
    assert db.execute(
        "select remaining, payload from pgqueue.waiting_jobs where id = %s", (waits,)
    ).fetchone() == (2, {"x": 1})
    assert job_by_id(db, waits)["workflow_id"] == done, "the smallest of its dependencies'"
    again = [{"kind": "keyed", "idempotency_key": "k1"}, {"kind": "c", "depends_on_index": [0]}]
    (first, _c) = [i for (i,) in db.execute("select pgqueue.enqueue_many(%s)", (Jsonb(again),))]
    assert first == keyed, "the key's job"
    stored = db.execute("select count(*) from pgqueue.waiting_jobs").fetchone()
    for bad, message in [
        ({"kind": "x", "payload": {"_dependencies": 1}, "depends_on_index": [0]}, "_dependencies"),
        ({"kind": "x", "traceparent": "nope", "depends_on_index": [0]}, "traceparent must be"),
        ({"kind": "x", "on_conflict": "merge", "depends_on_index": [0]}, "on_conflict must be"),
    ]:
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
            db.execute("select pgqueue.enqueue_many(%s)", (Jsonb([{"kind": "y"}, bad]),))
    assert db.execute("select count(*) from pgqueue.waiting_jobs").fetchone() == stored


def test_cancelling_a_workflows_root_cancels_what_waits_on_it(db: psycopg.Connection) -> None:
    root = enqueue(db, "root")
    fan = [enqueue(db, "fan", root) for _ in range(3)]
    last = enqueue(db, "last", *fan)
    other = enqueue(db, "other")
    assert db.execute("select pgqueue.cancel(%s)", (root,)).fetchone() == (True,)
    assert [status(db, x) for x in [root, *fan, last]] == ["cancelled"] * 5
    assert status(db, other) == "queued"
    assert db.execute("select count(*) from pgqueue.waiting_jobs").fetchone() == (0,)
    # a waiting job cancelled by its id takes its dependents along
    first = enqueue(db, "first")
    middle = enqueue(db, "middle", first)
    end = enqueue(db, "end", middle)
    assert db.execute("select pgqueue.cancel(%s)", (middle,)).fetchone() == (True,)
    assert [status(db, x) for x in (first, middle, end)] == ["queued", "cancelled", "cancelled"]


def test_stats_and_metrics_count_waiting_jobs_per_queue_and_kind(db: psycopg.Connection) -> None:
    def waiting() -> tuple[dict, dict]:
        stats = db.execute(
            "select queue, kind, jobs, runnable from pgqueue.stats where status = 'waiting'"
        ).fetchall()
        gauges = db.execute(
            "select labels->>'queue', labels->>'kind', value from pgqueue.metrics()"
            " where metric = 'pgqueue_jobs_waiting'"
        ).fetchall()
        return (
            {(q, k): (n, r) for q, k, n, r in stats},
            {(q, k): v for q, k, v in gauges},
        )

    a = enqueue(db, "a")
    enqueue(db, "b", a)
    enqueue(db, "b", a)
    enqueue(db, "c", a, queue="wf")
    stats, gauges = waiting()
    assert stats == {("default", "b"): (2, 0), ("wf", "c"): (1, 0)}
    assert gauges == {("default", "a"): 0, ("default", "b"): 2, ("wf", "c"): 1}
    # a queue whose jobs all wait is a queue the gauges know
    (paused,) = db.execute(
        "select value from pgqueue.metrics()"
        " where metric = 'pgqueue_queue_paused' and labels->>'queue' = 'wf'"
    ).fetchone()
    assert paused == 0
    (job,) = claim_all(db)
    complete(db, job)
    stats, gauges = waiting()
    assert stats == {}
    assert gauges == {("default", "b"): 0, ("wf", "c"): 0}, "released: queued now"


def test_cancel_jobs_and_retry_jobs_take_a_workflow_and_cancel_jobs_waiting_ones(
    db: psycopg.Connection,
) -> None:
    def bulk(call: str, **kw: object) -> int:
        args = ", ".join(f"{k} => %({k})s" for k in kw)
        return db.execute(f"select pgqueue.{call}({args})", kw).fetchone()[0]

    a = enqueue(db, "a")
    b = enqueue(db, "b", a)
    c = enqueue(db, "c", a)
    f = enqueue(db, "f", b)
    d = enqueue(db, "d")
    e = enqueue(db, "b", d)  # another workflow's waiting `b`
    plain = enqueue(db, "a")
    # a waiting job has no key: a key matches none of them (and cancels nothing)
    assert bulk("cancel_jobs", status="waiting", idempotency_key="k") == 0
    # the waiting `b` of a's workflow (by any of its jobs' ids), and what waits on it
    assert bulk("cancel_jobs", status="waiting", kind="b", workflow=c) == 1
    assert [status(db, x) for x in (a, b, c, f, d, e)] == [
        *("queued", "cancelled", "waiting", "cancelled", "queued", "waiting"),
    ]
    assert job_by_id(db, b)["last_error"] is None
    assert job_by_id(db, f)["last_error"] == f"dependency {b} was cancelled"
    # queued ones of the workflow only: its first job, and what waits on it goes along
    assert bulk("cancel_jobs", status="queued", workflow=a) == 1
    assert [status(db, x) for x in (a, c, d, plain)] == [
        *("cancelled", "cancelled", "queued", "queued"),
    ]
    assert bulk("cancel_jobs", workflow=d) == 1  # null: the queued ones
    assert status(db, e) == "cancelled"
    # retry_jobs() brings back a's workflow alone, its steps waiting again in order
    assert bulk("retry_jobs", workflow=b) == 4
    assert [status(db, x) for x in (a, b, c, f, d, e)] == [
        *("queued", "waiting", "waiting", "waiting", "cancelled", "cancelled"),
    ]
    ran = [job["id"] for job in run(db)]
    assert sorted(ran) == sorted([a, b, c, f, plain])
    assert ran.index(a) < ran.index(b) < ran.index(f) and ran.index(a) < ran.index(c)
    assert bulk("cancel_jobs", status="waiting", workflow=d) == 0


def test_retrying_a_dead_lettered_step_resumes_its_dependents(db: psycopg.Connection) -> None:
    a = enqueue(db, "a")
    b = enqueue(db, "b", a)
    c = enqueue(db, "c", a)
    d = enqueue(db, "d", b, c)
    (job,) = claim_all(db)
    complete(db, job, "a")
    jobs = {j["kind"]: j for j in claim_all(db)}
    dead_letter(db, jobs["b"], "flaky")
    complete(db, jobs["c"], "c")
    assert (status(db, d), job_by_id(db, d)["last_error"]) == (
        "cancelled",
        f"dependency {b} was dead-lettered: flaky",
    )
    assert db.execute("select pgqueue.retry(%s)", (b,)).fetchone() == (True,)
    assert status(db, d) == "waiting", "back, waiting for the retried step"
    assert job_by_id(db, d)["depends_on"] == [
        {"id": b, "kind": "b", "status": "queued"},
        {"id": c, "kind": "c", "status": "done"},
    ]
    (again,) = claim_all(db)
    assert again["id"] == b
    complete(db, again, "b")
    (last,) = claim_all(db)
    assert last["id"] == d
    assert last["payload"]["_dependencies"][str(b)]["result"] == "b"
    assert last["payload"]["_dependencies"][str(c)]["result"] == "c"


def test_a_dependency_done_on_a_later_attempt_is_handed_on_without_its_old_error(
    db: psycopg.Connection,
) -> None:
    """A job done after a failed attempt keeps that attempt's error in its history row; its
    dependents are told it is done, with its result and no error (a handler that checks the
    error would take it for a failure)."""
    a = enqueue(db, "a")
    b = enqueue(db, "b", a)
    (job,) = claim_all(db)
    (outcome,) = db.execute(
        "select pgqueue.fail(%s, %s, 'flaky', retry_in => interval '0')",
        (job["id"], job["lock_token"]),
    ).fetchone()
    assert outcome == "queued"
    (job,) = claim_all(db)
    complete(db, job, "a")
    assert job_by_id(db, a)["last_error"] == "flaky", "the failed attempt's error is kept"
    (last,) = claim_all(db)
    assert last["id"] == b
    assert last["payload"]["_dependencies"] == {
        str(a): {"kind": "a", "status": "done", "result": "a"}
    }
    with db.cursor(row_factory=dict_row) as cur:
        fetched = cur.execute("select * from pgqueue.dependency_results(%s)", (b,)).fetchall()
    assert fetched == [{"id": a, "kind": "a", "status": "done", "result": "a", "error": None}]


def test_a_cancelled_dependent_waits_again_until_every_failed_dependency_is_retried(
    db: psycopg.Connection,
) -> None:
    a, b = enqueue(db, "a"), enqueue(db, "b")
    both = enqueue(db, "both", a, b)
    for job in claim_all(db):
        dead_letter(db, job)
    assert status(db, both) == "cancelled"
    db.execute("select pgqueue.retry(%s)", (a,))
    assert status(db, both) == "cancelled", "b is still a dead letter"
    db.execute("select pgqueue.retry_jobs('failed')")
    assert status(db, both) == "waiting"
    run(db)
    assert status(db, both) == "done"


def test_a_step_that_ran_and_failed_runs_again_when_retried_with_what_it_was_handed(
    db: psycopg.Connection,
) -> None:
    """retry() of a step that was released and then dead-lettered itself re-runs it with the
    dependencies it was handed: a 'run' step told its dependency failed does not wait again
    for that dead letter (which would leave it waiting for good); a step cancelled while it
    waited waits again (above)."""
    a = enqueue(db, "a")
    told = enqueue(db, "cleanup", a, on_dependency_failure="run")
    (job,) = claim_all(db)
    dead_letter(db, job, "a broke")
    (cleanup,) = claim_all(db)
    handed = cleanup["payload"]["_dependencies"]
    assert handed[str(a)]["status"] == "failed"
    dead_letter(db, cleanup, "cleanup broke too")
    assert db.execute("select pgqueue.retry(%s)", (told,)).fetchone() == (True,)
    assert status(db, told) == "queued", "runs again, not waiting for the dead letter a"
    (again,) = claim_all(db)
    assert (again["id"], again["payload"]["_dependencies"]) == (told, handed)
    assert status(db, a) == "failed"


def test_what_enqueue_refuses(db: psycopg.Connection) -> None:
    a = enqueue(db, "a")
    cases = [
        ({"deps": [a, 999_999_999]}, "job 999999999 does not exist (or was pruned)"),
        ({"deps": [a, None]}, "depends_on holds a null"),
        ({"deps": [a], "payload": Jsonb({"_dependencies": {}})}, "_dependencies"),
        ({"deps": [a], "idempotency_key": "k"}, "cannot have an idempotency_key"),
        ({"deps": [a], "on_dependency_failure": "skip"}, "must be cancel or run"),
    ]
    for args, message in cases:
        extra = {k: v for k, v in args.items() if k != "deps"}
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=re.escape(message)):
            enqueue(db, "b", *args["deps"], **extra)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="must name earlier elements"):
        db.execute(
            "select pgqueue.enqueue_many(%s)",
            (Jsonb([{"kind": "x"}, {"kind": "y", "depends_on_index": [1]}]),),
        )
    assert db.execute("select count(*) from pgqueue.waiting_jobs").fetchone() == (0,)
    assert db.execute("select count(*) from pgqueue.job_dependencies").fetchone() == (0,)


def test_enqueue_many_enqueues_a_whole_workflow_and_the_list_finds_it(
    db: psycopg.Connection,
) -> None:
    outside = enqueue(db, "outside")
    ids = [
        r[0]
        for r in db.execute(
            "select pgqueue.enqueue_many(%s)",
            (
                Jsonb(
                    [
                        {"kind": "extract", "payload": {"n": 1}},
                        {"kind": "extract", "payload": {"n": 2}},
                        {"kind": "merge", "depends_on_index": [0, 1], "depends_on": [outside]},
                        {"kind": "notify", "depends_on_index": [2]},
                    ]
                ),
            ),
        )
    ]
    extract1, extract2, merge, notify = ids
    assert job_by_id(db, merge)["depends_on"] == [
        {"id": outside, "kind": "outside", "status": "queued"},
        {"id": extract1, "kind": "extract", "status": "queued"},
        {"id": extract2, "kind": "extract", "status": "queued"},
    ]
    assert job_by_id(db, notify)["workflow_id"] == outside, "the smallest of its dependencies'"
    listed = db.execute(
        "select id, status from pgqueue.list_jobs('waiting', workflow => %s)", (outside,)
    ).fetchall()
    assert listed == [(notify, "waiting"), (merge, "waiting")]
    # found whole by any of its jobs' ids, the second first job's among them
    assert (
        db.execute(
            "select id, status from pgqueue.list_jobs('waiting', workflow => %s)", (extract2,)
        ).fetchall()
        == listed
    )
    assert db.execute(
        "select pgqueue.count_jobs('queued', workflow => %s)", (outside,)
    ).fetchone() == (3,)
    assert db.execute("select pgqueue.count_jobs('waiting')").fetchone() == (2,)
    assert db.execute(
        "select count(*) from pgqueue.live_jobs where status = 'waiting'"
    ).fetchone() == (2,)
    run(db)
    assert db.execute(
        "select pgqueue.count_jobs('done', workflow => %s)", (outside,)
    ).fetchone() == (5,)


def test_count_jobs_counts_a_workflow_of_more_than_1000_jobs_up_to_its_cap(
    db: psycopg.Connection,
) -> None:
    """count_jobs(workflow => id) counts as the other filters do: up to the cap (10,000 by
    default), cap + 1 meaning more; a workflow's job kept in a batch counts too."""
    root = enqueue(db, "root")
    children = [{"kind": "child", "depends_on": [root]} for _ in range(1500)]
    db.execute("select pgqueue.enqueue_many(%s)", (Jsonb(children),))
    count = "select pgqueue.count_jobs(%s, workflow => %s, cap => %s)"
    assert db.execute(count, ("waiting", root, 10000)).fetchone() == (1500,)
    assert db.execute(count, ("waiting", root, 1200)).fetchone() == (1201,), "more than 1,200"
    run(db)
    assert db.execute(count, ("done", root, 10000)).fetchone() == (1501,)
    assert db.execute(count, ("done", root, 1000)).fetchone() == (1001,)
    first, _other = [
        job_id
        for (job_id,) in db.execute(
            "select pgqueue.enqueue_many(%s)", (Jsonb([{"kind": "batched"}] * 2),)
        )
    ]
    assert db.execute("select count(*) from pgqueue.job_batches").fetchone() == (1,)
    enqueue(db, "after", first)
    assert db.execute(count, ("queued", first, 10000)).fetchone() == (1,), "the batch's one"
    assert db.execute(count, ("waiting", first, 10000)).fetchone() == (1,)


def test_the_sweeper_releases_a_job_whose_dependencies_all_finished(
    db: psycopg.Connection,
) -> None:
    a = enqueue(db, "a")
    b = enqueue(db, "b", a)
    c = enqueue(db, "c", a)
    run(db, {"a": 1})
    assert status(db, b) == "done"
    # as if the completion of x had not counted itself (a 1.4.0 call in flight during the
    # update to 1.5.0): its edge out of its sight while it completes
    x = enqueue(db, "x")
    stuck = enqueue(db, "stuck", b, c, x)
    db.execute("delete from pgqueue.job_dependencies where dependency_id = %s", (x,))
    run(db)
    db.execute("insert into pgqueue.job_dependencies values (%s, %s)", (x, stuck))
    assert status(db, stuck) == "waiting"
    db.execute("select pgqueue.sweep()")
    assert status(db, stuck) == "queued"
    (job,) = claim_all(db)
    assert set(job["payload"]["_dependencies"]) == {str(b), str(c), str(x)}


def test_signed_in_users_may_depend_only_on_their_own_jobs(
    clients: psycopg.Connection,
) -> None:
    db = clients
    db.execute("select pgqueue.allow_client_kind('report', 100)")
    alice, bob = uuid.uuid4(), uuid.uuid4()

    def submit(user: uuid.UUID, *depends_on: int) -> int:
        claims = json.dumps({"role": "authenticated", "sub": str(user)})
        with db.transaction():
            db.execute("select set_config('role', 'authenticated', true)")
            db.execute("select set_config('request.jwt.claims', %s, true)", (claims,))
            (job_id,) = db.execute(
                "select pgqueue_public.client_enqueue('report', depends_on => %s::bigint[])",
                (list(depends_on) or None,),
            ).fetchone()
        return job_id

    first = submit(alice)
    second = submit(alice, first)
    assert status(db, second) == "waiting"
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match=f"job {first} is not one"):
        submit(bob, first)
    plain = enqueue(db, "plain")
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match=f"job {plain} is not one"):
        submit(alice, plain)


def at_once(*steps: object) -> None:
    """Runs `steps` (functions) at once, each in its own thread, started together."""
    start = threading.Barrier(len(steps))
    errors: list[BaseException] = []

    def run_step(step) -> None:
        try:
            start.wait()
            step()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run_step, args=(step,)) for step in steps]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors


def test_dependents_enqueued_while_their_dependency_completes_never_stay_waiting(
    db: psycopg.Connection, stack: Cluster
) -> None:
    """Many rounds of a race: one connection completes a running job while another enqueues
    jobs that depend on it. Whichever commits first, none of them is left waiting (no sweep)."""
    stuck = []
    with stack.connect(autocommit=True) as worker, stack.connect(autocommit=True) as app:

        def enqueue_three(dependency: int) -> None:
            with app.transaction():
                for _ in range(3):
                    enqueue(app, "dependent", dependency)

        for round_ in range(150):
            dependency = enqueue(db, "dependency")
            (running,) = claim_all(db)
            assert running["id"] == dependency
            at_once(partial(complete, worker, running), partial(enqueue_three, dependency))
            (waiting,) = db.execute("select count(*) from pgqueue.waiting_jobs").fetchone()
            if waiting:
                stuck.append(round_)
            db.execute("truncate pgqueue.jobs, pgqueue.waiting_jobs, pgqueue.job_dependencies")
    assert stuck == [], "rounds that left dependents waiting for a done job"


def test_a_workflow_enqueued_in_one_call_while_its_dependency_ends_never_misses_it(
    db: psycopg.Connection, stack: Cluster
) -> None:
    """The race through enqueue_many(), whose elements are stored together: a call holding
    a job of its own, one that waits for a running job, and one that waits for both, while
    the running job is completed (even rounds) or dead-lettered (odd). Whichever commits
    first, the dependent of the running job alone runs (or is cancelled, naming it), and the
    other waits only for its sibling of the call (or is cancelled)."""
    wrong = []
    with stack.connect(autocommit=True) as worker, stack.connect(autocommit=True) as app:

        def enqueue_workflow(dependency: int) -> None:
            elements = [
                {"kind": "sibling"},
                {"kind": "dependent", "depends_on": [dependency]},
                {"kind": "both", "depends_on": [dependency], "depends_on_index": [0]},
            ]
            app.execute("select pgqueue.enqueue_many(%s)", (Jsonb(elements),))

        for round_ in range(150):
            dependency = enqueue(db, "dependency")
            (running,) = claim_all(db)
            end = complete if round_ % 2 == 0 else dead_letter
            at_once(partial(end, worker, running), partial(enqueue_workflow, dependency))
            found = db.execute(
                "select j.kind, j.status, w.remaining, j.last_error from pgqueue.live_jobs as j "
                "left join pgqueue.waiting_jobs as w on w.id = j.id "
                "where j.kind in ('dependent', 'both') order by j.kind"
            ).fetchall()
            if round_ % 2 == 0:
                expected = [("both", "waiting", 1, None), ("dependent", "queued", None, None)]
            else:
                expected = []
                cancelled = db.execute(
                    "select kind, last_error from pgqueue.job_history where status = 'cancelled' "
                    "order by kind"
                ).fetchall()
                failure = f"dependency {dependency} was dead-lettered: boom"
                if cancelled != [("both", failure), ("dependent", failure)]:
                    wrong.append((round_, cancelled))
            if found != expected:
                wrong.append((round_, found))
            db.execute(
                "truncate pgqueue.jobs, pgqueue.waiting_jobs, pgqueue.job_dependencies, "
                "pgqueue.job_history"
            )
    assert wrong == [], "rounds that missed the end of the running dependency"


def test_dependents_enqueued_while_their_queued_dependency_is_claimed_and_completed(
    db: psycopg.Connection, stack: Cluster
) -> None:
    """The same race with a queued dependency: while an enqueue of jobs that depend on it is
    open (it holds its transaction 20 ms), a worker keeps claiming and completing; the
    dependency is claimed only once the enqueue committed, or its completion sees them."""
    stuck = []
    with stack.connect(autocommit=True) as worker, stack.connect(autocommit=True) as app:

        def enqueue_three_slowly(dependency: int) -> None:
            with app.transaction():
                for _ in range(3):
                    enqueue(app, "dependent", dependency)
                app.execute("select pg_sleep(0.02)")

        def claim_and_complete(dependency: int) -> None:
            for _ in range(2000):
                batch = complete_and_claim(worker, max_jobs=10, kinds=["dependency"])
                for job in batch:
                    complete(worker, job)
                if dependency in {j["id"] for j in batch}:
                    return
            raise AssertionError(f"job {dependency} was never claimed")

        for round_ in range(40):
            dependency = enqueue(db, "dependency")
            at_once(
                partial(claim_and_complete, dependency), partial(enqueue_three_slowly, dependency)
            )
            (waiting,) = db.execute("select count(*) from pgqueue.waiting_jobs").fetchone()
            if waiting:
                stuck.append(round_)
            db.execute("truncate pgqueue.jobs, pgqueue.waiting_jobs, pgqueue.job_dependencies")
    assert stuck == [], "rounds that left dependents waiting for a done job"


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_random_workflows_with_random_failures_under_4_workers(
    db: psycopg.Connection, stack: Cluster, seed: int
) -> None:
    """Random DAGs with random failures, half enqueued up front in one enqueue_many call and
    half while 4 workers run: no job is claimed before its dependencies are finished, none
    twice, each ends as its dependencies' outcomes say, and none is left waiting."""
    rng = random.Random(seed)
    n = 200
    deps = [sorted(rng.sample(range(i), k=min(i, rng.choice([0, 1, 1, 2, 3])))) for i in range(n)]
    fails = [rng.random() < 0.15 for _ in range(n)]
    runs = [rng.random() < 0.2 for _ in range(n)]

    def element(i: int) -> dict:
        return {
            "kind": "node",
            "payload": {"i": i, "fail": fails[i]},
            **({"on_dependency_failure": "run"} if runs[i] else {}),
        }

    up_front = n // 2
    ids: list[int] = [
        r[0]
        for r in db.execute(
            "select pgqueue.enqueue_many(%s)",
            (Jsonb([{**element(i), "depends_on_index": deps[i]} for i in range(up_front)]),),
        )
    ]
    claimed: Counter[int] = Counter()
    problems: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    enqueuing = threading.Event()
    enqueuing.set()

    def check(conn: psycopg.Connection, job: dict) -> None:
        i = job["payload"]["i"]
        given = job["payload"].get("_dependencies", {})
        if set(given) != {str(ids[d]) for d in deps[i]}:
            problems.append(f"node {i} was given {sorted(given)}")
        # every dependency finished before this job could be claimed
        for d in deps[i]:
            (state,) = conn.execute("select status from pgqueue.job(%s)", (ids[d],)).fetchone()
            if state not in ("done", "failed", "cancelled") or (state != "done" and not runs[i]):
                problems.append(f"node {i} claimed while its dependency {d} is {state}")

    def worker(k: int) -> None:
        sizes = random.Random(seed * 10 + k)
        try:
            with stack.connect(autocommit=True) as conn:
                batch: list[dict] = []
                idle = 0
                while idle < 20:
                    done = [j for j in batch if not j["payload"]["fail"]]
                    for job in batch:
                        if job["payload"]["fail"]:
                            dead_letter(conn, job)
                    batch = complete_and_claim(conn, done, max_jobs=sizes.choice([1, 3, 5]))
                    with lock:
                        claimed.update(j["id"] for j in batch)
                    for job in batch:
                        check(conn, job)
                    if batch or enqueuing.is_set():
                        idle = 0
                    else:
                        # (queued or running: a job left waiting for nothing stops no one)
                        (left,) = conn.execute(
                            "select exists (select from pgqueue.live_jobs"
                            " where status <> 'waiting')"
                        ).fetchone()
                        idle = 0 if left else idle + 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    try:
        for i in range(up_front, n):
            options = {"on_dependency_failure": "run"} if runs[i] else {}
            payload = Jsonb(element(i)["payload"])
            ids.append(enqueue(db, "node", *(ids[d] for d in deps[i]), payload=payload, **options))
    finally:
        enqueuing.clear()
    for thread in threads:
        thread.join(120)
    assert not errors
    assert problems == []
    assert max(claimed.values()) == 1, "no job claimed twice"
    index = {job_id: i for i, job_id in enumerate(ids)}
    outcome: list[str] = []
    for i in range(n):
        broken = any(outcome[d] != "done" for d in deps[i])
        outcome.append("cancelled" if broken and not runs[i] else "failed" if fails[i] else "done")
    final = {
        index[r[0]]: r[1]
        for r in db.execute(
            "select j.id, j.status from unnest(%s::bigint[]) as x(id),"
            " lateral pgqueue.job(x.id) as j",
            (ids,),
        )
    }
    assert [final[i] for i in range(n)] == outcome
    assert set(claimed) == {ids[i] for i in range(n) if outcome[i] != "cancelled"}
    assert db.execute("select count(*) from pgqueue.waiting_jobs").fetchone() == (0,)


def test_the_docs_sql_example_runs_as_written(db: psycopg.Connection, stack: Cluster) -> None:
    page = (REPO / "docs" / "workflows.md").read_text()
    example = page.split("### A complete example", 1)[1].split("```sql\n", 1)[1].split("```")[0]
    with stack.connect(autocommit=True) as conn:
        conn.execute(example)
        ((dependencies,),) = conn.execute("select payload -> '_dependencies' from album")
        drawn = conn.execute(
            "select id, kind, status, depends_on, result"
            " from pgqueue.workflow((select id from album))"
        ).fetchall()
    (small, _, _, _, _), (large, _, _, _, _), (album, *_) = drawn
    assert dependencies == {
        str(small): {"kind": "resize", "status": "done", "result": {"path": "beach.jpg@64w"}},
        str(large): {"kind": "resize", "status": "done", "result": {"path": "beach.jpg@1024w"}},
    }
    assert drawn == [
        (small, "resize", "done", [], {"path": "beach.jpg@64w"}),
        (large, "resize", "done", [], {"path": "beach.jpg@1024w"}),
        (album, "album", "running", [small, large], None),
    ]


def test_a_users_waiting_jobs_show_in_my_jobs_and_cancel_with_what_waits_on_them(
    clients: psycopg.Connection,
) -> None:
    db = clients
    db.execute("select pgqueue.allow_client_kind('report', 100)")
    user = uuid.uuid4()

    def as_user(sql: str, *args: object) -> list[tuple]:
        claims = json.dumps({"role": "authenticated", "sub": str(user)})
        with db.transaction():
            db.execute("select set_config('role', 'authenticated', true)")
            db.execute("select set_config('request.jwt.claims', %s, true)", (claims,))
            return db.execute(sql, args).fetchall()

    ((first,),) = as_user("select pgqueue_public.client_enqueue('report')")
    ((second,),) = as_user(
        "select pgqueue_public.client_enqueue('report', depends_on => array[%s]::bigint[])",
        first,
    )
    ((third,),) = as_user(
        "select pgqueue_public.client_enqueue('report', depends_on => array[%s]::bigint[])",
        second,
    )
    assert as_user("select id, status from pgqueue_public.my_jobs order by id") == [
        (first, "queued"),
        (second, "waiting"),
        (third, "waiting"),
    ]
    # the caps count waiting jobs as live
    assert db.execute("select pgqueue._end_client_jobs('report', null)").fetchone() == (0,)
    assert as_user("select pgqueue_public.client_cancel(%s)", second) == [(True,)]
    assert as_user("select id, status from pgqueue_public.my_jobs order by id") == [
        (first, "queued"),
        (second, "cancelled"),
        (third, "cancelled"),
    ]
    assert db.execute("select pgqueue._end_client_jobs('report', null)").fetchone() == (2,)


def test_completing_plain_jobs_costs_one_index_probe_of_the_dependencies(
    db: psycopg.Connection,
) -> None:
    """What a completion pays for workflows when its jobs have none: one scan of
    job_dependencies' key for its ids (none found), never a scan of the table, nor the precise
    work behind it."""
    root = enqueue(db, "root")
    for _ in range(50):
        enqueue(db, "leaf", root)
    db.execute(
        "insert into pgqueue.job_dependencies select g, g + 1 from generate_series(1, 20000) as g"
    )
    db.execute("analyze pgqueue.job_dependencies")
    plain = [
        r[0]
        for r in db.execute(
            "select pgqueue.enqueue_many(%s)",
            (Jsonb([{"kind": "plain", "priority": 1} for _ in range(20)]),),
        )
    ]
    batch = complete_and_claim(db, max_jobs=20)
    assert sorted(j["id"] for j in batch) == plain
    with plans_logged(db) as plans:
        complete_and_claim(db, batch, max_jobs=0)
    probes = [p for p in plans if "job_dependencies" in p]
    assert len(probes) == 1, probes
    assert "Index Only Scan using job_dependencies_pkey" in probes[0], probes[0]
    assert "Seq Scan" not in probes[0], probes[0]
    assert {status(db, x) for x in plain} == {"done"}


def test_a_waiting_job_has_no_idempotency_key_to_list_or_count_it_by(
    db: psycopg.Connection,
) -> None:
    """list_jobs('waiting', idempotency_key => ...) finds none (a waiting job has no key) and
    count_jobs() counts none: the key filters, it is not ignored."""
    root = enqueue(db, "root")
    waiting = enqueue(db, "leaf", root)
    listed = db.execute("select id from pgqueue.list_jobs('waiting')").fetchall()
    assert listed == [(waiting,)]
    by_key = "select id from pgqueue.list_jobs('waiting', idempotency_key => 'k')"
    assert db.execute(by_key).fetchall() == []
    counted = "select pgqueue.count_jobs('waiting', idempotency_key => 'k')"
    assert db.execute(counted).fetchone() == (0,)
    assert db.execute("select pgqueue.count_jobs('waiting')").fetchone() == (1,)
