"""End to end, the Edge Function within its isolate's limits (scaled down): an isolate lives a
fixed wall-clock time from its start however many wake-ups it serves, so a wake-up late in its
life stops claiming at the isolate's deadline, not at its own budget, and hands back the jobs
still running (release(): no attempt spent) before the isolate ends; and when the runtime
unloads the function early (`beforeunload`, as on a CPU or memory limit), the same happens at
once. The function runs under real Deno with the Edge runtime's stand-in (edge_runtime.ts),
which unloads it and ends the process as the platform would."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest

from testkit.postgrest import PostgRESTStandIn
from testkit.stack import point_wake_ups

from .deno_worker import Deno, start_edge_worker, stop_edge_worker
from .test_edge_flow_control import enqueue_probes
from .test_edge_linger import summaries, wait_for_summaries, wake


def jobs(db: psycopg.Connection) -> list[tuple]:
    return db.execute(
        "select status, attempts, last_error from pgqueue.all_jobs order by id"
    ).fetchall()


@pytest.mark.parametrize(
    ("settings", "stopped_by"),
    [
        # A 10 s isolate (the free plan's 150 s, scaled down), woken 5 s into its life with a
        # 10 s budget: the deadline is 9 s into the isolate (10 s less a tenth), and the
        # platform would end it at 10 s.
        (
            {
                "PGQUEUE_WALL_CLOCK_LIMIT_SECONDS": "10",
                "PGQUEUE_TIME_BUDGET_SECONDS": "10",
                "EDGE_RUNTIME_UNLOAD_AFTER_MS": "10000",
            },
            "wall-clock limit",
        ),
        # Unloaded 7 s into its life, long before any deadline: the runtime's beforeunload at
        # 90% of its CPU limit.
        (
            {"EDGE_RUNTIME_UNLOAD_AFTER_MS": "7000", "EDGE_RUNTIME_UNLOAD_REASON": "cpu"},
            "unload",
        ),
    ],
    ids=["late-wake-up-in-an-old-isolate", "beforeunload"],
)
def test_jobs_running_when_the_isolate_ends_go_back_to_the_queue_unspent(
    db: psycopg.Connection,
    deno: Deno,
    probe_function_dir: Path,
    postgrest: PostgRESTStandIn,
    settings: dict[str, str],
    stopped_by: str,
) -> None:
    point_wake_ups(db, None, None)  # the test's POST is the only wake-up
    worker = start_edge_worker(
        deno, probe_function_dir, postgrest, edge_runtime=True, PGQUEUE_LINGER_MS="0", **settings
    )
    try:
        time.sleep(5)
        done_first, *held = enqueue_probes(db, {}, *[{"holdMs": 60_000}] * 5)
        wake(worker)

        assert worker.wait_for_exit(timeout=15) == 0
        assert jobs(db) == [("done", 1, None)] + [("queued", 0, None)] * 5, worker.output()
        [summary] = summaries(worker)
        assert summary["stoppedBy"] == stopped_by
        if stopped_by == "unload":
            assert summary["unloadReason"] == "cpu"
        assert (summary["completed"], summary["released"]) == (1, 5)
        assert (
            db.execute("select count(*) from pgqueue.all_jobs where run_after <= now()").fetchone()[
                0
            ]
            == 5
        ), "released jobs are due at once"
        assert done_first < held[0]
    finally:
        stop_edge_worker(worker)


def test_a_job_no_isolate_lives_long_enough_for_ends_dead_lettered_not_released_forever(
    db: psycopg.Connection, deno: Deno, probe_function_dir: Path, postgrest: PostgRESTStandIn
) -> None:
    """Each isolate is unloaded while the job still runs: the first two hand it back unspent,
    the third release counts the attempt, and with its one attempt used the job is a dead
    letter that says why."""
    point_wake_ups(db, None, None)  # the test's POSTs are the only wake-ups
    (job_id,) = enqueue_probes(db, {"holdMs": 60_000})
    db.execute("update pgqueue.jobs set max_attempts = 1 where id = %s", (job_id,))
    for isolate in range(1, 4):
        worker = start_edge_worker(
            deno,
            probe_function_dir,
            postgrest,
            edge_runtime=True,
            PGQUEUE_LINGER_MS="0",
            EDGE_RUNTIME_UNLOAD_AFTER_MS="4000",
        )
        try:
            wake(worker)
            assert worker.wait_for_exit(timeout=15) == 0
            [summary] = summaries(worker)
            assert (summary["stoppedBy"], summary["released"]) == ("unload", 1), worker.output()
        finally:
            stop_edge_worker(worker)
        if isolate < 3:
            assert jobs(db) == [("queued", 0, None)]
    [(status, attempts, error)] = jobs(db)
    assert (status, attempts) == ("failed", 1)
    assert error.startswith("released 3 times in a row without finishing")
    assert error.endswith("counted as attempt 1 of 1")


@pytest.mark.parametrize(
    ("probe", "slots", "stopped_at"),
    [
        # One slot, jobs of 50 ms of CPU each: no claim past 90% of the 200 ms soft limit, the
        # jobs running end as usual, the rest wait for another isolate.
        ({"spinMs": 50}, "1", "soft"),
        # Three at once, 150 ms each, then waiting on I/O: past 75% of the 400 ms hard limit
        # the drain hands all three back, before the runtime would end the isolate.
        ({"spinMs": 150, "holdMs": 60_000}, "3", "hard"),
    ],
    ids=["soft-limit-stops-claims", "hard-limit-hands-back"],
)
def test_a_drain_keeps_within_the_isolates_cpu_time(
    db: psycopg.Connection,
    deno: Deno,
    probe_function_dir: Path,
    postgrest: PostgRESTStandIn,
    probe: dict,
    slots: str,
    stopped_at: str,
) -> None:
    """The function's own meter (cpu.ts), under real Deno: handlers that hold the thread."""
    point_wake_ups(db, None, None)  # the test's POST is the only wake-up
    worker = start_edge_worker(
        deno,
        probe_function_dir,
        postgrest,
        PGQUEUE_LINGER_MS="0",
        PGQUEUE_CPU_SOFT_LIMIT_MS="200",
        PGQUEUE_CPU_HARD_LIMIT_MS="400",
        PGQUEUE_BATCH_SIZE=slots,
        PGQUEUE_MAX_JOBS_IN_FLIGHT=slots,
    )
    try:
        enqueue_probes(db, *[probe] * 10)
        wake(worker)
        [summary] = wait_for_summaries(worker, 1)
    finally:
        stop_edge_worker(worker)

    assert summary["stoppedBy"] == "cpu budget", worker.output()
    statuses = jobs(db)
    if stopped_at == "soft":
        assert summary["cpuMs"] >= 180
        assert 1 <= summary["completed"] <= 4
        assert summary["released"] == 0
        assert statuses.count(("done", 1, None)) == summary["completed"]
    else:
        assert summary["cpuMs"] >= 300
        assert (summary["completed"], summary["released"]) == (0, 3)
    assert statuses.count(("queued", 0, None)) == 10 - summary["completed"], (
        "the others wait for another isolate, no attempt spent"
    )
