"""50,000 jobs through 4 worker processes with handlers failing on purpose; the same with
workers killed by SIGKILL at random moments; and with the xmin horizon held back."""

from __future__ import annotations

import random
import time
from pathlib import Path

import psycopg

from tests.support.cluster import Cluster
from tests.worker.helpers import WorkerProcess

from .conftest import PYTHON, Fleet
from .harness import Plan, Sweeper, audit, enqueue_plan, figures, wait_drained

SOAK_JOBS = 50_000  # as the issue says
KILL_JOBS = 20_000
XMIN_JOBS = 15_000
WORKERS = 4


def test_soak_every_job_ends_once(
    db: psycopg.Connection, stack: Cluster, fleet: Fleet, audit_dir: Path
) -> None:
    plan = Plan.soak(SOAK_JOBS, max_attempts=3)
    ids = enqueue_plan(db, plan)
    workers = fleet(PYTHON, WORKER_LEASE_SECONDS=10)
    with Sweeper(stack.dsn()) as sweeper:
        for n in range(WORKERS):
            workers.start(ready=False, WORKER_NAME=f"w{n}")
        drained = wait_drained(stack.dsn(), timeout=120)
    assert all(w.proc.poll() is None for w in workers.started), "a worker died"

    result = audit(db, ids, audit_dir, plan)
    figures(
        "soak",
        jobs=result.jobs,
        kinds=3,
        workers=WORKERS,
        kills=0,
        restarts=0,
        drain_s=drained,
        jobs_per_s=result.jobs / drained,
        done=result.done,
        failed=result.failed,
        retried=result.retried,
        attempts=result.attempts,
        sweeps=sweeper.sweeps,
        lost=result.lost,
    )
    result.check()
    assert result.failed > 0 and result.retried > result.failed  # the chaos did happen
    assert result.rerun_after_fault == 0


def test_workers_killed_at_random_lose_nothing(
    db: psycopg.Connection, stack: Cluster, fleet: Fleet, audit_dir: Path
) -> None:
    plan = Plan.soak(KILL_JOBS, max_attempts=5, seed=11)
    ids = enqueue_plan(db, plan)
    workers = fleet(PYTHON, WORKER_LEASE_SECONDS=2)
    rng = random.Random(3)
    names: dict[WorkerProcess, str] = {}
    killed: set[str] = set()

    def start() -> None:
        name = f"w{len(names)}"
        names[workers.start(ready=False, WORKER_NAME=name)] = name

    started = time.monotonic()
    with Sweeper(stack.dsn(), interval=0.5) as sweeper:
        for _ in range(WORKERS):
            start()
        # Kill a random worker every 0.3 to 1.2 s, each time starting a new one, until 8
        # died with jobs in hand; then the survivors and the sweeper finish the run.
        while len(killed) < 8 and still_running(db):
            time.sleep(rng.uniform(0.3, 1.2))
            victim = rng.choice([w for w in names if w.proc.poll() is None])
            victim.proc.kill()  # SIGKILL: nothing is released, nothing is reported
            victim.wait(10)
            killed.add(names[victim])
            start()
        wait_drained(stack.dsn(), timeout=90)
    drained = time.monotonic() - started

    result = audit(db, ids, audit_dir, plan, faulty_run=lambda e: e.worker in killed)
    figures(
        "kill -9",
        jobs=result.jobs,
        workers=WORKERS,
        kills=len(killed),
        restarts=len(killed),
        drain_s=drained,
        done=result.done,
        failed=result.failed,
        retried=result.retried,
        rescued_by_sweep=sweeper.rescued,
        rerun_after_kill=result.rerun_after_fault,
        lost=result.lost,
    )
    result.check()
    assert len(killed) >= 5
    assert sweeper.rescued > 0  # jobs of killed workers came back through sweep()


def test_a_held_xmin_horizon_slows_claims_but_keeps_them_right(
    db: psycopg.Connection, stack: Cluster, fleet: Fleet, tmp_path: Path
) -> None:
    """The same run twice on an emptied table: once as is, once while another session keeps
    a snapshot open (what a forgotten `idle in transaction` session does), so autovacuum
    cannot remove the rows the run leaves dead."""
    rates = {}
    for held in (False, True):
        db.execute("truncate pgqueue.jobs")
        logs = tmp_path / f"audit-{'held' if held else 'free'}"
        logs.mkdir()
        plan = Plan.soak(XMIN_JOBS, max_attempts=3, seed=5)
        ids = enqueue_plan(db, plan)
        with psycopg.connect(stack.dsn()) as holder:
            if held:
                holder.execute("begin isolation level repeatable read")
                holder.execute("select txid_current()")
            workers = fleet(PYTHON, RELIABILITY_AUDIT_DIR=logs)
            started = time.monotonic()
            with Sweeper(stack.dsn()):
                for n in range(WORKERS):
                    workers.start(ready=False, WORKER_NAME=f"x{n}")
                wait_drained(stack.dsn(), timeout=120)
            elapsed = time.monotonic() - started
            holder.rollback()
        workers.kill_all()
        result = audit(db, ids, logs, plan)
        rates[held] = result.jobs / elapsed
        figures(
            "xmin held" if held else "xmin free",
            jobs=result.jobs,
            workers=WORKERS,
            drain_s=elapsed,
            jobs_per_s=rates[held],
            done=result.done,
            failed=result.failed,
            lost=result.lost,
        )
        result.check()
    figures("xmin effect", throughput_ratio=rates[True] / rates[False])


def still_running(db: psycopg.Connection) -> bool:
    """Are jobs still queued or running?"""
    row = db.execute(
        "select exists (select from pgqueue.jobs where status in ('queued', 'running'))"
    ).fetchone()
    return bool(row and row[0])
