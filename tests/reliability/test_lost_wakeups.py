"""The worker's URL goes down while pg_net posts wake-ups (python-http): pg_net does not
retry, so those wake-ups are lost for good. Once the URL answers again, the sweeper's
re-wake brings the worker in and the queue drains; and with no wake-up getting through at
all, the worker's own idle poll drains it. Nothing is lost either way."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

import psycopg

from tests.support.cluster import Cluster, free_port
from tests.support.pg_net import PgNetWorker
from tests.support.postgrest import make_jwt
from tests.support.stack import point_wake_ups, wake_up_settings

from .conftest import HTTP, Fleet
from .harness import Plan, Sweeper, audit, enqueue_plan, figures, unfinished, wait_drained


class Door:
    """A TCP front for the worker on a port of its own: open, it passes connections through;
    shut, the port refuses them (as a worker URL that is down does)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []

    def open(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def shut(self) -> None:
        if self._listener is not None:
            # shutdown() first: close() alone does not wake a thread blocked in accept()
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.close()
        self._conns.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def responses(db: psycopg.Connection) -> tuple[int, int]:
    row = db.execute(
        "select count(*) filter (where status_code = 202),"
        " count(*) filter (where status_code is distinct from 202) from net._http_response"
    ).fetchone()
    assert row is not None
    return row[0], row[1]


def test_lost_wakeups_are_made_up_by_the_sweeper(
    db: psycopg.Connection,
    stack: Cluster,
    pg_net: PgNetWorker,
    fleet: Fleet,
    audit_dir: Path,
) -> None:
    key = make_jwt("service_role")
    # no idle poll during the test: only wake-ups (the sweeper's re-wake here) bring it in
    worker = fleet(HTTP, SERVICE_ROLE_KEY=key, WORKER_POLL_INTERVAL=3600).start()
    door = Door(worker.port)
    door.open()
    # where wake-ups go, for this session and the sweeper's (what `alter database ... set`
    # does for a self-hosted project)
    wake_url = f"http://127.0.0.1:{door.port}/wake"
    point_wake_ups(db, wake_url, key)
    plan = Plan.soak(3_000, max_attempts=3, seed=23)
    up_front, during_outage = Plan(plan.jobs[:1_000]), Plan(plan.jobs[1_000:])

    sweeper = Sweeper(stack.dsn(), session_sql=wake_up_settings(wake_url, key))
    with sweeper:  # pg_cron, all along
        ids = enqueue_plan(db, up_front, chunk=100)  # 10 statements, 10 wake-ups
        wait_drained(stack.dsn(), timeout=30)
        door.shut()
        ids += enqueue_plan(db, during_outage, chunk=100)  # 20 wake-ups into a closed port
        pg_net.wait_idle()
        time.sleep(1.5)  # and a few sweeps, whose re-wakes are lost too
        pg_net.wait_idle()
        stranded = unfinished(db)
        delivered, failed = responses(db)
        assert stranded == len(during_outage.jobs)  # no wake-up got through: nothing ran

        door.open()
        drained = wait_drained(stack.dsn(), timeout=60)
    pg_net.wait_idle()
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
    assert failed >= 20
    assert worker.proc.poll() is None


def test_with_every_wake_up_lost_the_idle_poll_drains_the_queue(
    db: psycopg.Connection,
    stack: Cluster,
    pg_net: PgNetWorker,
    fleet: Fleet,
    audit_dir: Path,
) -> None:
    """No sweeper (pg_cron is down too) and a worker URL that refuses every wake-up: the
    worker, polling every 2 s when idle, still finds and runs every job."""
    key = make_jwt("service_role")
    poll_s = 2.0
    worker = fleet(HTTP, SERVICE_ROLE_KEY=key, WORKER_POLL_INTERVAL=poll_s).start()
    closed = Door(worker.port)  # never opened: its port refuses connections
    point_wake_ups(db, f"http://127.0.0.1:{closed.port}/wake", key)
    plan = Plan.soak(2_000, max_attempts=3, seed=29)

    started = time.monotonic()
    ids = enqueue_plan(db, plan, chunk=100)  # 20 wake-ups, every one refused
    wait_drained(stack.dsn(), timeout=60)
    drained_s = time.monotonic() - started
    pg_net.wait_idle()
    delivered, failed = responses(db)
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
    assert delivered == 0 and failed >= 20
    assert worker.proc.poll() is None
