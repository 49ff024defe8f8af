"""The worker's URL goes down (refuses connections) while the real pg_net posts wake-ups
(python-http): pg_net does not retry, so those wake-ups are lost for good. Once the URL
answers again, the sweeper's re-wake brings the worker in and the queue drains; and with no
wake-up getting through at all, the worker's own idle poll drains it. Nothing is lost
either way."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg

from testkit.cluster import Cluster
from testkit.postgrest import make_jwt
from testkit.stack import point_wake_ups, wait_for_pg_net
from tests.support.wake_signing import secret_for

from .conftest import HTTP, Fleet
from .harness import (
    Door,
    Plan,
    Sweeper,
    audit,
    enqueue_plan,
    figures,
    unfinished,
    wait_drained,
    wake_up_outcomes,
)


def test_lost_wakeups_are_made_up_by_the_sweeper(
    db: psycopg.Connection,
    stack: Cluster,
    fleet: Fleet,
    audit_dir: Path,
) -> None:
    key = secret_for("wake-secret-of-the-reliability-suite-0123")
    # no idle poll and no linger (it waits on LISTEN) during the test: only wake-ups (the
    # sweeper's re-wake here) bring it in
    worker = fleet(
        HTTP,
        SERVICE_ROLE_KEY=make_jwt("service_role"),
        WAKE_SECRET=key,
        WORKER_POLL_INTERVAL=3600,
        WORKER_LINGER_SECONDS=0,
    ).start()
    door = Door(worker.port)
    door.open()
    # where wake-ups go, for this session and the sweeper's (what `alter database ... set`
    # does for a self-hosted project)
    wake_url = door.url
    point_wake_ups(db, wake_url, key)
    plan = Plan.soak(3_000, max_attempts=3, seed=23)
    up_front, during_outage = Plan(plan.jobs[:1_000]), Plan(plan.jobs[1_000:])

    sweeper = Sweeper(stack.dsn())
    with sweeper:  # pg_cron, all along
        ids = enqueue_plan(db, up_front, chunk=100)  # 10 statements, 10 wake-ups
        wait_drained(stack.dsn(), timeout=30)
        door.shut()
        # 20 statements into a closed port: wake() queues no second wake-up while one for the
        # same queues waits unsent in pg_net's queue, so they send one or a few, each refused
        ids += enqueue_plan(db, during_outage, chunk=100)
        wait_for_pg_net(db)
        time.sleep(1.5)  # and a few sweeps, whose re-wakes are lost too
        wait_for_pg_net(db)
        stranded = unfinished(db)
        outcomes = wake_up_outcomes(db)
        delivered, failed = outcomes["accepted"], outcomes["failed"]
        assert stranded == len(during_outage.jobs)  # no wake-up got through: nothing ran

        door.open()
        drained = wait_drained(stack.dsn(), timeout=60)
    result = audit(db, ids, audit_dir, plan)
    figures(
        "worker URL down",
        jobs=result.jobs,
        stranded=stranded,
        wakeups_delivered_before=delivered,
        wakeups_failed=failed,
        sweeps=sweeper.sweeps,
        drain_after_back_s=drained,
        done=result.done,
        failed=result.failed,
        lost=result.lost,
    )
    result.check()
    assert failed >= 1, "the wake-ups during the outage were sent, and refused"
    assert worker.proc.poll() is None


def test_with_every_wake_up_lost_the_idle_poll_drains_the_queue(
    db: psycopg.Connection,
    stack: Cluster,
    fleet: Fleet,
    audit_dir: Path,
) -> None:
    """No sweeper (pg_cron is down too) and a worker URL that refuses every wake-up: the
    worker, polling every 2 s when idle, still finds and runs every job."""
    key = secret_for("wake-secret-of-the-reliability-suite-0123")
    poll_s = 2.0
    # no linger (it waits on LISTEN): only the idle poll finds the jobs
    worker = fleet(
        HTTP,
        SERVICE_ROLE_KEY=make_jwt("service_role"),
        WAKE_SECRET=key,
        WORKER_POLL_INTERVAL=poll_s,
        WORKER_LINGER_SECONDS=0,
    ).start()
    closed = Door(worker.port)  # never opened: its port refuses connections
    point_wake_ups(db, closed.url, key)
    plan = Plan.soak(2_000, max_attempts=3, seed=29)

    started = time.monotonic()
    ids = enqueue_plan(db, plan, chunk=100)  # 20 statements: one or a few wake-ups, all refused
    wait_drained(stack.dsn(), timeout=60)
    drained_s = time.monotonic() - started
    wait_for_pg_net(db)
    outcomes = wake_up_outcomes(db)
    delivered, failed = outcomes["accepted"], outcomes["failed"]
    result = audit(db, ids, audit_dir, plan)
    figures(
        "every wake-up lost, no sweeper",
        jobs=result.jobs,
        wakeups_delivered=delivered,
        wakeups_failed=failed,
        poll_interval_s=poll_s,
        drain_s=drained_s,
        done=result.done,
        failed=result.failed,
        lost=result.lost,
    )
    result.check()
    assert delivered == 0 and failed >= 1
    assert worker.proc.poll() is None
