"""A handler that hangs far past its timeout, awaiting or blocked in a thread: the worker
abandons it when the timeout expires, the job is retried, and the worker serves other jobs
all along (before, during and after)."""

from __future__ import annotations

from pathlib import Path

import psycopg

from testkit.cluster import Cluster
from tests.support.jobs import enqueue, job

from .conftest import PYTHON, Fleet
from .harness import Plan, Sweeper, audit, enqueue_plan, executions, figures, wait_drained

OTHERS = 2_000


def test_a_hung_handler_is_abandoned_and_retried_while_others_run(
    db: psycopg.Connection, stack: Cluster, fleet: Fleet, audit_dir: Path
) -> None:
    hung = {how: enqueue(db, "hang", max_attempts=3, how=how) for how in ("await", "thread")}
    plan = Plan.soak(OTHERS, max_attempts=3, seed=17)
    others = enqueue_plan(db, plan)
    # a lease far longer than the timeout: the timeout, not the sweeper, must end the hang
    worker = fleet(PYTHON, WORKER_CONCURRENCY=4, WORKER_BATCH_SIZE=4, WORKER_LEASE_SECONDS=30)
    worker.start(ready=False, WORKER_NAME="hang0")
    with Sweeper(stack.dsn()):
        drained = wait_drained(stack.dsn(), timeout=60)
    process = worker.started[0]
    assert process.proc.poll() is None, process.output()

    runs = executions(audit_dir)
    served_during = {}
    for how, job_id in hung.items():
        row = job(db, job_id)
        assert (row["status"], row["attempts"]) == ("done", 2), row
        # a done job kept by batch keeps no error: the worker logged the first attempt's
        retried = [e for e in process.events("job.retried") if e["job_id"] == job_id]
        assert [(e["attempt"], e["error"]) for e in retried] == [
            (1, "TimeoutError: timed out after 1s")
        ]
        first = next(e for e in runs[job_id] if e.attempt == 1 and e.event == "start")
        # jobs the worker finished while this handler hung
        served_during[how] = sum(
            1
            for i in others
            for e in runs.get(i, [])
            if e.event == "ok" and first.t < e.t < first.t + 1
        )
    result = audit(db, [*hung.values(), *others], audit_dir)
    figures(
        "hung handler",
        jobs=result.jobs,
        hung=len(hung),
        timeout_s=1,
        served_while_await_hung=served_during["await"],
        served_while_thread_hung=served_during["thread"],
        drain_s=drained,
        done=result.done,
        failed=result.failed,
        lost=result.lost,
    )
    result.check()
    assert all(served_during.values()), served_during
