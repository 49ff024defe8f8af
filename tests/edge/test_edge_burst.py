"""End to end, a burst of wake-ups: pg_net sends its queued POSTs in batches, all at once, so
an Edge Function instance may get dozens of wake-ups in the same moment. They are one drain:
the first starts it, the others join it, and the jobs in flight stay within the cap
(PGQUEUE_MAX_JOBS_IN_FLIGHT), whether many jobs wait or few. Each test prints its figures:
drains, complete_and_claim calls (counted by the PostgREST stand-in), most jobs in flight."""

from __future__ import annotations

import math
import time
from pathlib import Path

import psycopg
import pytest
from psycopg.types.json import Jsonb

from testkit.postgrest import PostgRESTStandIn
from testkit.stack import point_wake_ups, wait_for_pg_net
from tests.support.wake_signing import signed

from .deno_worker import Deno, EdgeWorker, start_edge_worker, stop_edge_worker
from .test_edge_flow_control import enqueue_probes
from .test_edge_linger import summaries
from .test_edge_worker import wait_for_jobs, wake_responses

WAKE_UPS = 30
CAP = 10


def send_wake_ups(db: psycopg.Connection, worker: EdgeWorker, count: int) -> None:
    """`count` wake-ups, each signed as the database signs one, queued in pg_net by one
    statement: its worker sends them together. pg_net sends the body as jsonb's text."""
    body = Jsonb({"reason": "burst", "queues": ["default"]})
    (text,) = db.execute("select %s::text", (body,)).fetchone()
    headers = [Jsonb(signed(worker.wake_secret, text.encode())) for _ in range(count)]
    db.execute(
        "select net.http_post(url := %s, body := %s, headers := h) from unnest(%s::jsonb[]) as h",
        (worker.url, body, headers),
    )


def woken(worker: EdgeWorker) -> int:
    return sum(summary["wakeUps"] for summary in summaries(worker))


@pytest.mark.parametrize("waiting", [400, 5])
def test_a_burst_of_wake_ups_is_one_drain_within_the_cap(
    db: psycopg.Connection,
    deno: Deno,
    probe_function_dir: Path,
    postgrest: PostgRESTStandIn,
    waiting: int,
) -> None:
    # Inserting wakes nobody: the burst below is the only wake-up.
    point_wake_ups(db, None, None)
    worker = start_edge_worker(
        deno,
        probe_function_dir,
        postgrest,
        PGQUEUE_LINGER_MS="0",
        PGQUEUE_BATCH_SIZE=str(CAP),
        PGQUEUE_MAX_JOBS_IN_FLIGHT=str(CAP),
    )
    try:
        enqueue_probes(db, *[{"holdMs": 20}] * waiting)
        calls_before = postgrest.rpc_calls["complete_and_claim"]

        send_wake_ups(db, worker, WAKE_UPS)
        wait_for_jobs(db, "status = 'done'", worker, timeout=60)
        wait_for_pg_net(db)
        deadline = time.monotonic() + 20
        while woken(worker) < WAKE_UPS:
            assert time.monotonic() < deadline, f"not every wake-up was served:\n{worker.output()}"
            time.sleep(0.05)

        assert wake_responses(db) == [202] * WAKE_UPS
        drains = len(summaries(worker))
        calls = postgrest.rpc_calls["complete_and_claim"] - calls_before
        most = max(e["inFlight"] for e in worker.events() if e["event"] == "probe.start")
        print(
            f"\n{WAKE_UPS} wake-ups, {waiting} jobs waiting: {drains} drains, "
            f"{calls} complete_and_claim calls, at most {most} jobs in flight"
        )
        assert drains == 1
        assert most <= CAP
        # The slots are refilled once half of them are free (or one has waited 20 ms): a
        # claim per half a pool of jobs, and a few that find the queue empty.
        assert calls <= math.ceil(waiting / (CAP // 2)) + 4
    finally:
        stop_edge_worker(worker)
