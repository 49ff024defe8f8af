"""The PostgreSQL server restarted under running workers, with a fast shutdown and with an
immediate one (a crash, as far as the workers can tell): they reconnect with backoff and
finish the run; no job is lost.

This test has a cluster of its own: a restart would break every other fixture's connections
to the shared one. Its commits are synchronous (unlike the other test clusters): an
immediate shutdown may lose the WAL of asynchronous commits, and that would be the test's
setting losing jobs, not the queue."""

from __future__ import annotations

import time
from pathlib import Path

from testkit.cluster import Cluster
from tests.support.jobs import wait_until

from .conftest import PYTHON, Fleet
from .harness import (
    Execution,
    Plan,
    Sweeper,
    audit,
    enqueue_plan,
    enqueue_slow,
    executions,
    figures,
    wait_drained,
)

JOBS = 20_000
WORKERS = 2
LEASE_SECONDS = 3


def done_count(cluster: Cluster) -> int:
    with cluster.connect(autocommit=True) as conn:
        row = conn.execute("select count(*) from pgqueue.all_jobs where status = 'done'").fetchone()
    assert row is not None
    return row[0]


def worker_connections(cluster: Cluster) -> int:
    with cluster.connect(autocommit=True) as conn:
        row = conn.execute(
            "select count(*) from pg_stat_activity where application_name = 'my-app-worker'"
        ).fetchone()
    assert row is not None
    return row[0]


def test_workers_ride_out_server_restarts(
    own_cluster: Cluster, fleet: Fleet, audit_dir: Path
) -> None:
    plan = Plan.soak(JOBS, max_attempts=5, seed=13)
    with own_cluster.connect(autocommit=True) as conn:
        ids = enqueue_plan(conn, plan, batched=True)
    workers = fleet(PYTHON, DB_URL=own_cluster.dsn(), WORKER_LEASE_SECONDS=LEASE_SECONDS)
    outages: list[tuple[float, float]] = []  # (stopped, back), time.time()
    reconnected: list[float] = []  # seconds from the server's return to every worker's

    started = time.monotonic()
    with Sweeper(own_cluster.dsn()) as sweeper:
        for n in range(WORKERS):
            workers.start(ready=False, WORKER_NAME=f"r{n}")
        for mode, at in (("fast", 0.25), ("immediate", 0.6)):
            while done_count(own_cluster) < at * JOBS:
                time.sleep(0.05)
            stopped = time.time()
            own_cluster.stop(mode)
            time.sleep(1)  # down long enough for the workers to notice and back off
            own_cluster.start()
            outages.append((stopped, time.time()))
            back = time.monotonic()
            wait_until(
                # each worker: one connection for its calls, one that LISTENs
                lambda: worker_connections(own_cluster) >= 2 * WORKERS,
                timeout=30,
                what="every worker to reconnect",
            )
            reconnected.append(time.monotonic() - back)
        wait_drained(own_cluster.dsn(), timeout=120)
    drained = time.monotonic() - started
    assert all(w.proc.poll() is None for w in workers.started), "a worker died"

    def cut_off(e: Execution) -> bool:
        """Ran while a restart could keep its outcome from being reported in time."""
        return any(down - LEASE_SECONDS <= e.t <= up + 2 * LEASE_SECONDS for down, up in outages)

    with own_cluster.connect(autocommit=True) as conn:
        result = audit(conn, ids, audit_dir, plan, faulty_run=cut_off)
    figures(
        "server restarts",
        jobs=result.jobs,
        workers=WORKERS,
        kills=0,
        restarts="fast+immediate",
        drain_s=drained,
        done=result.done,
        failed=result.failed,
        retried=result.retried,
        back_in_s="+".join(f"{s:.1f}" for s in reconnected),
        rescued_by_sweep=sweeper.rescued,
        rerun_after_restart=result.rerun_after_fault,
        lost=result.lost,
    )
    result.check()


# Successes that wait out a restart: jobs end while the server is down, and it comes back
# 3.2 s after they ended, when a report retried with backoff (0.2 s, doubling) has made its
# fifth try and waits 3.2 s more for its sixth.
SLOW_JOBS = 20
BACK_AFTER = 3.2


def test_successes_reach_a_restarted_server_at_once(
    own_cluster: Cluster, fleet: Fleet, audit_dir: Path
) -> None:
    """Jobs that succeed while the server is down are recorded within a second of its
    return, not when their report's backoff ends (by then the sweeper may have taken their
    leases back, and they would run again); none runs twice."""
    workers = fleet(PYTHON, DB_URL=own_cluster.dsn(), WORKER_LEASE_SECONDS=8)
    workers.start(ready=False, WORKER_NAME="restarted")
    with own_cluster.connect(autocommit=True) as conn:
        ids = enqueue_slow(conn, SLOW_JOBS)
    with Sweeper(own_cluster.dsn(), interval=0.2):
        wait_until(
            lambda: len(executions(audit_dir)) == SLOW_JOBS,
            timeout=10,
            what="every job to start",
        )
        own_cluster.stop("immediate")
        ended = wait_until(
            lambda: [
                e.t for runs in executions(audit_dir).values() for e in runs if e.event == "ok"
            ],
            timeout=10,
            what="the jobs to end",
        )
        time.sleep(max(0.0, min(ended) + BACK_AFTER - time.time()))
        own_cluster.start()
        back = time.time()
        wait_until(lambda: done_count(own_cluster) == SLOW_JOBS, timeout=20, what="the jobs")
    with own_cluster.connect(autocommit=True) as conn:
        recorded = [
            row[0].timestamp()
            for row in conn.execute(
                "select finished_at from pgqueue.all_jobs where id = any(%s)", (ids,)
            )
        ]
    late = max(recorded) - back
    runs = executions(audit_dir)
    figures(
        "successes after a restart", jobs=SLOW_JOBS, back_after_s=back - min(ended), late_s=late
    )
    assert late < 1.0, f"the last success was recorded {late:.2f} s after the server was back"
    assert all(len([e for e in runs[i] if e.event == "start"]) == 1 for i in ids), runs
