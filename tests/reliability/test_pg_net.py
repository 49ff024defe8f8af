"""Faults of the real pg_net itself, on the python-http worker's wake-up path (its idle poll
off, so only wake-ups bring it in): an endpoint slower than the wake-up's 2 s timeout, pg_net's
background worker restarted in the middle of a stream (`net.worker_restart()`), and the
PostgreSQL server restarted under it (a crash empties pg_net's unlogged queue of unsent
requests). pg_net never retries; the sweeper's re-wake makes up for every wake-up lost, and
the audit finds every job done or dead-lettered exactly once."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg

from testkit.cluster import Cluster
from testkit.postgrest import make_jwt
from testkit.stack import point_wake_ups, wait_for_pg_net
from tests.support.jobs import wait_until
from tests.support.wake_signing import secret_for

from .conftest import HTTP, Fleet
from .harness import (
    Door,
    Execution,
    Plan,
    Sweeper,
    audit,
    enqueue_plan,
    figures,
    start_delays,
    stream,
    unfinished,
    wait_drained,
    wake_up_outcomes,
)

WAKE_TIMEOUT_S = 2  # the timeout wake() gives pg_net for each request


def test_an_endpoint_slower_than_the_request_timeout(
    db: psycopg.Connection, stack: Cluster, fleet: Fleet, audit_dir: Path
) -> None:
    """While the worker's URL takes every request and answers none for 5 s, each wake-up
    times out after 2 s and the jobs wait; each batch of pg_net's waits out the timeout of
    its slowest request. Once the URL answers again, the sweeper's re-wake drains them."""
    key = secret_for("wake-secret-of-the-reliability-suite-0123")
    # no idle poll and no linger (it waits on LISTEN): only wake-ups bring it in
    worker = fleet(
        HTTP,
        SERVICE_ROLE_KEY=make_jwt("service_role"),
        WAKE_SECRET=key,
        WORKER_POLL_INTERVAL=3600,
        WORKER_LINGER_SECONDS=0,
    ).start()
    door = Door(worker.port)
    door.open()
    point_wake_ups(db, door.url, key)
    plan = Plan.soak(2_000, max_attempts=3, seed=31)
    up_front, while_slow = Plan(plan.jobs[:500]), Plan(plan.jobs[500:])

    with Sweeper(stack.dsn()) as sweeper:
        ids = enqueue_plan(db, up_front, chunk=100)  # 5 wake-ups, answered
        wait_drained(stack.dsn(), timeout=30)
        door.slow(hold=5)
        slow_since = time.monotonic()
        # 15 statements: wake() queues no second wake-up while one for the same queues waits
        # unsent in pg_net's queue, so they send one or a few, none answered
        ids += enqueue_plan(db, while_slow, chunk=100)
        wait_until(
            lambda: wake_up_outcomes(db)["timed_out"] >= 1,
            timeout=30,
            what="the wake-ups sent while the URL is slow to time out",
        )
        timed_out_after = time.monotonic() - slow_since
        stranded = unfinished(db)
        assert stranded == len(while_slow.jobs)  # no wake-up got through: nothing ran

        door.open()
        drained = wait_drained(stack.dsn(), timeout=60)
    wait_for_pg_net(db, timeout=30)
    outcomes = wake_up_outcomes(db)
    result = audit(db, ids, audit_dir, plan)
    figures(
        "endpoint slower than the timeout",
        jobs=result.jobs,
        stranded=stranded,
        timed_out=outcomes["timed_out"],
        accepted=outcomes["accepted"],
        first_timed_out_in_s=timed_out_after,
        sweeps=sweeper.sweeps,
        drain_after_back_s=drained,
        done=result.done,
        failed=result.failed,
        lost=result.lost,
    )
    result.check()
    assert outcomes["timed_out"] >= 1
    # the timeout was waited out: pg_net took at least one full timeout before giving up
    assert timed_out_after >= WAKE_TIMEOUT_S
    assert worker.proc.poll() is None


def requests_queued(db: psycopg.Connection) -> int:
    """How many requests pg_net has ever queued in this database (its queue's id sequence)."""
    row = db.execute(
        "select case when is_called then last_value else 0 end from net.http_request_queue_id_seq"
    ).fetchone()
    assert row is not None
    return row[0]


def test_pg_net_worker_restarted_in_the_middle_of_a_stream(
    db: psycopg.Connection, stack: Cluster, fleet: Fleet, audit_dir: Path
) -> None:
    """One job per statement at 50 a second, and pg_net's background worker restarted
    (`select net.worker_restart()`) three times meanwhile: its queue is a table, so the
    requests queued while it was down go out when it is back."""
    key = secret_for("wake-secret-of-the-reliability-suite-0123")
    # no idle poll and no linger (it waits on LISTEN): only wake-ups bring it in
    worker = fleet(
        HTTP,
        SERVICE_ROLE_KEY=make_jwt("service_role"),
        WAKE_SECRET=key,
        WORKER_POLL_INTERVAL=3600,
        WORKER_LINGER_SECONDS=0,
    ).start()
    wake_url = f"{worker.url}/wake"
    point_wake_ups(db, wake_url, key)
    plan = Plan.soak(600, max_attempts=3, seed=37)
    restarts: list[bool] = []

    def restart() -> None:
        with psycopg.connect(stack.dsn(), autocommit=True) as conn:
            row = conn.execute("select net.worker_restart()").fetchone()
            restarts.append(bool(row and row[0]))

    queued_before = requests_queued(db)
    started = time.monotonic()
    with Sweeper(stack.dsn()) as sweeper:
        ids = stream(db, plan, rate=50, at={150: restart, 300: restart, 450: restart})
        drained = wait_drained(stack.dsn(), timeout=60)
    elapsed = time.monotonic() - started
    wait_for_pg_net(db, timeout=30)
    outcomes = wake_up_outcomes(db)
    sent = sum(outcomes.values())
    # At most one request per enqueue statement and re-waking sweep: none while one for the
    # same queue still waits in pg_net's queue (as it does while pg_net's worker is down).
    asked = len(ids) + sweeper.woke
    queued = requests_queued(db) - queued_before
    delays = start_delays(db, ids, audit_dir)
    result = audit(db, ids, audit_dir, plan)
    figures(
        "pg_net worker restarted x3",
        jobs=result.jobs,
        rate_per_s=50,
        restarts=len(restarts),
        wakeups_asked=asked,
        wakeups_queued=queued,
        wakeups_sent=sent,
        accepted=outcomes["accepted"],
        start_delay_p50_s=delays["p50"],
        start_delay_p95_s=delays["p95"],
        start_delay_max_s=delays["max"],
        drain_after_stream_s=drained,
        elapsed_s=elapsed,
        done=result.done,
        failed=result.failed,
        lost=result.lost,
    )
    result.check()
    assert restarts == [True, True, True]
    # none lost by a restart, all answered 202
    assert 0 < sent == queued == outcomes["accepted"] <= asked
    assert worker.proc.poll() is None


def test_server_restarts_lose_pg_nets_queue_and_the_sweeper_makes_up_for_it(
    own_cluster: Cluster, fleet: Fleet, audit_dir: Path
) -> None:
    """Streams of one job per statement at 200 a second, each ended by a server restart: a
    fast shutdown keeps pg_net's unsent requests (unlogged tables survive a clean shutdown)
    and pg_net sends them when the server is back; an immediate one (a crash) empties its
    queue, so those wake-ups are never sent. The sweeper's re-wake brings the worker back in
    either way."""
    key = secret_for("wake-secret-of-the-reliability-suite-0123")
    # no idle poll and no linger (it waits on LISTEN): only wake-ups bring it in
    worker = fleet(
        HTTP,
        DB_URL=own_cluster.dsn(),
        SERVICE_ROLE_KEY=make_jwt("service_role"),
        WAKE_SECRET=key,
        WORKER_POLL_INTERVAL=3600,
        WORKER_LINGER_SECONDS=0,
    ).start()
    wake_url = f"{worker.url}/wake"
    plan = Plan.soak(2_000, max_attempts=3, seed=41)
    halves = {"fast": Plan(plan.jobs[:1_000]), "immediate": Plan(plan.jobs[1_000:])}
    ids: list[int] = []
    unsent: dict[str, int] = {}  # requests in pg_net's queue when the server went down
    kept: dict[str, int] = {}  # ... and when it was back
    outages: list[tuple[float, float]] = []

    started = time.monotonic()
    with Sweeper(own_cluster.dsn()) as sweeper:
        for mode, part in halves.items():
            with own_cluster.connect(autocommit=True) as conn:
                point_wake_ups(conn, wake_url, key)
                ids += stream(conn, part, rate=200)
                row = conn.execute("select count(*) from net.http_request_queue").fetchone()
                unsent[mode] = row[0] if row else -1
            stopped = time.time()
            own_cluster.stop(mode)
            own_cluster.start()
            outages.append((stopped, time.time()))
            with own_cluster.connect(autocommit=True) as conn:
                row = conn.execute("select count(*) from net.http_request_queue").fetchone()
                kept[mode] = row[0] if row else -1
        drained = wait_drained(own_cluster.dsn(), timeout=60)
    elapsed = time.monotonic() - started
    assert worker.proc.poll() is None, worker.output()[-4000:]

    def cut_off(e: Execution) -> bool:
        """Ran while a restart could keep its outcome from being reported."""
        return any(down - 1 <= e.t <= up + 5 for down, up in outages)

    with own_cluster.connect(autocommit=True) as conn:
        result = audit(conn, ids, audit_dir, plan, faulty_run=cut_off)
    figures(
        "server restarts under pg_net",
        jobs=result.jobs,
        rate_per_s=200,
        unsent_at_fast_stop=unsent["fast"],
        kept_after_fast=kept["fast"],
        unsent_at_crash=unsent["immediate"],
        kept_after_crash=kept["immediate"],
        sweeps=sweeper.sweeps,
        sweep_rewakes=sweeper.woke,
        drain_after_last_restart_s=drained,
        elapsed_s=elapsed,
        done=result.done,
        failed=result.failed,
        rerun_after_restart=result.rerun_after_fault,
        lost=result.lost,
    )
    result.check()
    # At 200 statements a second pg_net always has requests waiting (it sends a batch, then
    # sleeps up to a second); a crash loses them: recovery empties unlogged tables.
    assert unsent["immediate"] > 0
    assert kept["immediate"] == 0
