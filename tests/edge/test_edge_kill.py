"""End to end, an isolate the platform kills outright (the Edge runtime's hard CPU limit ends it
with no `beforeunload`; here the Deno process gets SIGKILL in the middle of a batch): its jobs
can be claimed again within about a minute, because every claim asks for a lease no longer than
the isolate's time and at most a minute, not the database's five minutes (issue 49). The sweep
runs as pg_cron would, every second here."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg

from testkit.postgrest import PostgRESTStandIn
from testkit.stack import point_wake_ups

from .deno_worker import Deno, start_edge_worker, stop_edge_worker
from .test_edge_flow_control import enqueue_probes
from .test_edge_linger import wake

HELD = 5  # jobs running when the isolate dies
CLAIMABLE_WITHIN = 70  # seconds: a minute's lease, and the next sweep


def running(db: psycopg.Connection) -> list[tuple]:
    return db.execute(
        "select id, locked_until - locked_at from pgqueue.running_jobs order by id"
    ).fetchall()


def test_a_killed_isolates_jobs_are_claimed_again_within_a_minute(
    db: psycopg.Connection, deno: Deno, probe_function_dir: Path, postgrest: PostgRESTStandIn
) -> None:
    point_wake_ups(db, None, None)  # the test's POST is the only wake-up
    ids = enqueue_probes(db, *[{"holdMs": 600_000}] * HELD)
    worker = start_edge_worker(
        deno, probe_function_dir, postgrest, edge_runtime=True, PGQUEUE_LINGER_MS="0"
    )
    try:
        wake(worker)
        deadline = time.monotonic() + 30
        while len(running(db)) < HELD and time.monotonic() < deadline:
            time.sleep(0.2)
        leases = running(db)
        assert [job_id for job_id, _ in leases] == sorted(ids), worker.output()
        # the first claim too: a lease of at most a minute, not config.lease_seconds (300)
        assert all(lease.total_seconds() <= 60 for _, lease in leases), leases
        worker.process.kill()  # SIGKILL: no beforeunload, no release
        killed_at = time.monotonic()
        worker.process.wait(timeout=10)

        claimed: list[int] = []
        while not claimed and time.monotonic() - killed_at < CLAIMABLE_WITHIN + 5:
            db.execute("select pgqueue.sweep()")
            claimed = [
                row[0]
                for row in db.execute(
                    "select id from pgqueue.complete_and_claim('after-the-kill', max_jobs => 10)"
                )
            ]
            if not claimed:
                time.sleep(1)
        waited = time.monotonic() - killed_at
    finally:
        stop_edge_worker(worker)
    assert sorted(claimed) == sorted(ids), (claimed, worker.output())
    assert waited <= CLAIMABLE_WITHIN, f"claimed again {waited:.0f} s after the kill"
