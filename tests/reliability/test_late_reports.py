"""Successes a worker could not report while the database was out of its reach for longer than
their jobs' lease (issue 48's chaos finding: workers gave up after one lease, and 23 successes
ran again after two 8 s outages). The database takes such a report until a sweep takes the
job back, so the worker keeps trying: the success lands late, or the database refuses it
because the job was taken back, or the worker stops first; its log says which.

The worker reaches the database through a door the test shuts (connections refused, those
open cut) while the test's own sweeps go straight to it: the test chooses whether a sweep
comes before the worker's report. The cluster is the test's own: pg_cron's sweep is off."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.cluster import Cluster
from tests.support.jobs import wait_until
from tests.support.workers import WorkerProcess

from .conftest import PYTHON, Fleet
from .harness import Door, enqueue_slow, executions, figures

LEASE_SECONDS = 3
JOBS = 6


@pytest.fixture
def door(own_cluster: Cluster) -> Iterator[Door]:
    door = Door(own_cluster.port)
    door.open()
    yield door
    door.shut()


def sweep(cluster: Cluster) -> int:
    """One sweep, as pg_cron runs it; how many expired leases it took back."""
    with cluster.connect(autocommit=True) as conn:
        row = conn.execute("select rescued from pgqueue.sweep()").fetchone()
    assert row is not None
    return int(row[0])


def statuses(cluster: Cluster, ids: list[int]) -> dict[str, int]:
    with cluster.connect(autocommit=True) as conn:
        rows = conn.execute(
            "select status, count(*) from pgqueue.all_jobs where id = any(%s) group by 1", (ids,)
        ).fetchall()
    return dict(rows)


def expired_leases(cluster: Cluster, ids: list[int]) -> int:
    with cluster.connect(autocommit=True) as conn:
        row = conn.execute(
            "select count(*) from pgqueue.live_jobs"
            " where id = any(%s) and status = 'running' and locked_until < now()",
            (ids,),
        ).fetchone()
    assert row is not None
    return int(row[0])


def successes_behind_a_shut_door(
    fleet: Fleet, own_cluster: Cluster, door: Door, audit_dir: Path, **settings: object
) -> tuple[WorkerProcess, list[int]]:
    """A worker whose JOBS jobs (a second each) all succeed while its door is shut, and stay
    unreported until every one's lease has run out (the database still holds them)."""
    dsn = own_cluster.dsn().replace(f":{own_cluster.port}/", f":{door.port}/")
    workers = fleet(PYTHON, DB_URL=dsn, WORKER_LEASE_SECONDS=LEASE_SECONDS, LOG_LEVEL="INFO")
    worker = workers.start(WORKER_NAME="late-reporter", **settings)
    with own_cluster.connect(autocommit=True) as conn:
        ids = enqueue_slow(conn, JOBS)
    wait_until(lambda: len(executions(audit_dir)) == JOBS, timeout=10, what="every job to start")
    door.shut()
    wait_until(
        lambda: (
            sum(e.event == "ok" for runs in executions(audit_dir).values() for e in runs) == JOBS
        ),
        timeout=10,
        what="every handler to succeed",
    )
    wait_until(
        lambda: expired_leases(own_cluster, ids) == JOBS,
        timeout=LEASE_SECONDS * 3,
        what="every lease to run out",
    )
    # One lease more: a report that gave up after one lease (as before issue 48) has by now.
    time.sleep(LEASE_SECONDS)
    return worker, ids


def logged(worker: WorkerProcess, event: str) -> list[int]:
    return sorted(e["job_id"] for e in worker.events(event))


def test_a_success_reported_after_its_lease_lands_when_no_sweep_came_first(
    fleet: Fleet, own_cluster: Cluster, door: Door, audit_dir: Path
) -> None:
    worker, ids = successes_behind_a_shut_door(fleet, own_cluster, door, audit_dir)
    door.open()
    opened = time.monotonic()
    wait_until(
        lambda: statuses(own_cluster, ids) == {"done": JOBS},
        timeout=5,
        what="the late successes to land",
    )
    figures("late successes", jobs=JOBS, lease_s=LEASE_SECONDS, landed_s=time.monotonic() - opened)
    assert sweep(own_cluster) == 0, "nothing is left for a sweep to take back"
    runs = executions(audit_dir)
    assert all(sum(e.event == "start" for e in runs[i]) == 1 for i in ids), "none ran again"
    assert logged(worker, "job.done_late") == sorted(ids), worker.output()
    assert not worker.events("job.lost") and "lease had been lost" not in worker.output()


def test_a_success_whose_job_was_taken_back_is_logged_as_refused(
    fleet: Fleet, own_cluster: Cluster, door: Door, audit_dir: Path
) -> None:
    worker, ids = successes_behind_a_shut_door(fleet, own_cluster, door, audit_dir)
    assert sweep(own_cluster) == JOBS
    door.open()
    wait_until(
        lambda: len(logged(worker, "job.done_refused")) == JOBS,
        timeout=5,
        what="the refused reports to be logged",
    )
    assert logged(worker, "job.done_refused") == sorted(ids)
    assert not worker.events("job.done_late")
    # Taken back, the jobs run again (on this worker: the only one), and are done then.
    wait_until(lambda: statuses(own_cluster, ids) == {"done": JOBS}, timeout=10, what="re-runs")


def test_a_success_not_reported_when_the_worker_stops_is_logged_so(
    fleet: Fleet, own_cluster: Cluster, door: Door, audit_dir: Path
) -> None:
    worker, ids = successes_behind_a_shut_door(
        fleet, own_cluster, door, audit_dir, WORKER_SHUTDOWN_GRACE=1
    )
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=15) == 0, worker.output()
    assert logged(worker, "job.unreported") == sorted(ids), worker.output()
    assert not worker.events("job.done_late") and not worker.events("job.done_refused")
    assert statuses(own_cluster, ids) == {"running": JOBS}, "never reported: still running"
    assert sweep(own_cluster) == JOBS, "the sweeper takes them back"
