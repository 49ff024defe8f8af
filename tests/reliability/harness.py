"""What the reliability tests share: the jobs they run, the sweeper pg_cron would be, bulk and
streamed enqueues, a door in front of a worker's URL, the wait for a drained queue, and the
audit every fault run ends with.

Every handler execution is logged by the handler itself (tests/support/handlers/
reliability.py: one JSON line per event, appended with a single write to a file per worker
process, so a `kill -9` loses nothing it wrote), and the audit compares those logs with the
jobs table.
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest
from psycopg.types.json import Jsonb

from testkit.cluster import free_port

SOAK_KINDS = {
    "soak_email": lambda n: {"to": f"user{n}@example.com"},
    "soak_webhook": lambda n: {"url": f"https://example.com/hooks/{n}"},
    "soak_report": lambda n: {"rows": [n, n + 1, n + 2]},
}
TERMINAL = ("done", "failed", "cancelled")


def figures(name: str, **values: object) -> str:
    """One line of figures in the test output (run pytest with -s to see it)."""
    shown = " ".join(
        f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items()
    )
    line = f"[reliability] {name}: {shown}"
    print(line, flush=True)
    return line


@dataclass
class Plan:
    """Jobs to enqueue: (kind, payload, max_attempts), and what each should end as."""

    jobs: list[tuple[str, dict, int]]

    @classmethod
    def soak(cls, count: int, max_attempts: int = 3, seed: int = 7) -> Plan:
        """`count` jobs over the three soak kinds; 5% of them raise on their first attempt
        (a fifth of those on their second too, and one in 25 on every attempt)."""
        rng = random.Random(seed)
        kinds = list(SOAK_KINDS)
        jobs = []
        for n in range(count):
            kind = kinds[n % len(kinds)]
            fail = 0
            if rng.random() < 0.05:
                fail = rng.choices([1, 2, max_attempts], weights=[76, 20, 4])[0]
            jobs.append((kind, {"n": n, "fail": fail, **SOAK_KINDS[kind](n)}, max_attempts))
        return cls(jobs)

    def expected(self, index: int) -> tuple[str, int]:
        """(status, attempts) the job at `index` ends with when nothing else goes wrong."""
        _, payload, max_attempts = self.jobs[index]
        fail = payload.get("fail", 0)
        return ("failed", max_attempts) if fail >= max_attempts else ("done", fail + 1)


def enqueue_plan(
    db: psycopg.Connection, plan: Plan, chunk: int = 5000, batched: bool = False
) -> list[int]:
    """Enqueue the plan through pgqueue.enqueue_many, `chunk` jobs per statement, each job
    with its max_attempts (so stored a row each). With `batched`, a statement per kind of each
    chunk instead, max_attempts left out where it is the queue's default: those calls are
    stored as batch rows (pgqueue.job_batches), as an application's bulk enqueues are."""
    default = db.execute("select pgqueue.default_max_attempts()").fetchone()[0]
    ids: list[int | None] = [None] * len(plan.jobs)
    for start in range(0, len(plan.jobs), chunk):
        positions = range(start, min(start + chunk, len(plan.jobs)))
        groups: dict[object, list[int]] = {}
        for i in positions:
            kind, _, attempts = plan.jobs[i]
            groups.setdefault((kind, attempts) if batched else None, []).append(i)
        for group in groups.values():
            batch = [
                {"kind": kind, "payload": payload}
                | ({} if batched and attempts == default else {"max_attempts": attempts})
                for kind, payload, attempts in (plan.jobs[i] for i in group)
            ]
            rows = db.execute("select pgqueue.enqueue_many(%s)", (Jsonb(batch),)).fetchall()
            for i, row in zip(group, rows, strict=True):
                ids[i] = row[0]
    assert None not in ids
    if batched:  # (the tests that ask for batches enqueue before their workers start)
        assert db.execute("select exists (select from pgqueue.job_batches)").fetchone()[0]
    return ids  # type: ignore[return-value]


def enqueue_slow(db: psycopg.Connection, count: int, seconds: float = 1.0) -> list[int]:
    """`count` jobs of the handler `slow`, each sleeping `seconds`: their ids."""
    return [
        row[0]
        for row in db.execute(
            "select pgqueue.enqueue('slow', %s) from generate_series(1, %s)",
            (Jsonb({"seconds": seconds}), count),
        )
    ]


def stream(
    db: psycopg.Connection,
    plan: Plan,
    rate: float,
    at: dict[int, Callable[[], object]] | None = None,
) -> list[int]:
    """Enqueue the plan one job per statement (one wake-up each), `rate` jobs a second;
    `at[i]()` runs just before the i-th job."""
    ids: list[int] = []
    started = time.monotonic()
    for i, (kind, payload, attempts) in enumerate(plan.jobs):
        if at and i in at:
            at[i]()
        delay = started + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        row = db.execute(
            "select pgqueue.enqueue(%s, %s, max_attempts => %s)", (kind, Jsonb(payload), attempts)
        ).fetchone()
        assert row is not None
        ids.append(row[0])
    return ids


def start_delays(db: psycopg.Connection, ids: list[int], audit_dir: Path) -> dict[str, float]:
    """Seconds from each job's enqueue to its handler's first start: p50, p95 and max."""
    created = dict(
        db.execute(
            "select id, extract(epoch from created_at)::float8 from pgqueue.all_jobs"
            " where id = any(%s)",
            (ids,),
        ).fetchall()
    )
    runs = executions(audit_dir)
    delays = sorted(
        min(e.t for e in runs[i] if e.event == "start") - created[i]
        for i in ids
        if any(e.event == "start" for e in runs.get(i, []))
    )
    if len(delays) < 2:
        return {}
    return {
        "p50": statistics.median(delays),
        "p95": statistics.quantiles(delays, n=20)[-1],
        "max": delays[-1],
    }


class Door:
    """A TCP front for a worker on a port of its own. Open, it passes connections through;
    shut, the port refuses them (as a worker URL that is down does); slow, it takes each
    connection and the request on it, answers nothing, and closes it after `hold` seconds
    (as an endpoint slower than the caller's timeout does)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.hold: float | None = None
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/wake"

    def open(self) -> None:
        self.hold = None
        if self._listener is not None:
            return
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def slow(self, hold: float) -> None:
        self.open()
        self.hold = hold
        self._close_connections()  # pg_net keeps connections alive: no request may slip by

    def shut(self) -> None:
        if self._listener is not None:
            # shutdown() first: close() alone does not wake a thread blocked in accept()
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        self._close_connections()

    def _close_connections(self) -> None:
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
            self._conns.append(client)
            if self.hold is not None:
                threading.Thread(target=self._stall, args=(client, self.hold), daemon=True).start()
                continue
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            self._conns.append(upstream)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _stall(client: socket.socket, hold: float) -> None:
        deadline = time.monotonic() + hold
        client.settimeout(0.1)
        while time.monotonic() < deadline:
            try:
                if not client.recv(65536):  # the caller gave up and closed
                    break
            except TimeoutError:
                continue
            except OSError:
                break
        with contextlib.suppress(OSError):
            client.close()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def wake_up_outcomes(db: psycopg.Connection) -> dict[str, int]:
    """What became of the wake-ups pg_net took from its queue, from net._http_response."""
    row = db.execute(
        "select count(*) filter (where status_code = 202),"
        " count(*) filter (where status_code is not null and status_code <> 202),"
        " count(*) filter (where timed_out),"
        " count(*) filter (where status_code is null and not timed_out)"
        " from net._http_response"
    ).fetchone()
    assert row is not None
    return dict(zip(("accepted", "refused", "timed_out", "failed"), row, strict=True))


class Sweeper:
    """What pg_cron does, but every `interval` seconds instead of every minute: sweep()
    rescues expired leases and re-wakes workers. With `fast_backoff`, jobs waiting out a
    retry backoff are made due at once first (the test's clock runs faster than the
    backoff's). Survives a database restart: it reconnects, as pg_cron's next run would."""

    def __init__(
        self,
        dsn: str,
        interval: float = 0.5,
        fast_backoff: bool = True,
        session_sql: Iterable[tuple[str, tuple]] = (),
    ) -> None:
        self.dsn = dsn
        self.interval = interval
        self.fast_backoff = fast_backoff
        self.session_sql = list(session_sql)
        self.sweeps = 0
        self.rescued = 0
        self.dead_lettered = 0
        self.woke = 0  # sweeps that re-woke workers (a NOTIFY and a pg_net request)
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sweeper", daemon=True)

    def __enter__(self) -> Sweeper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        conn: psycopg.Connection | None = None
        while not self._stop.wait(self.interval):
            try:
                if conn is None or conn.closed or conn.broken:
                    conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=2)
                    for sql, params in self.session_sql:
                        conn.execute(sql, params)
                self.sweep(conn)
            except psycopg.OperationalError:
                self.errors += 1
                if conn is not None:
                    conn.close()
                conn = None
        if conn is not None:
            conn.close()

    def sweep(self, conn: psycopg.Connection) -> None:
        if self.fast_backoff:
            conn.execute(
                "update pgqueue.jobs set run_after = now()"
                " where status = 'queued' and run_after > now()"
            )
        row = conn.execute("select rescued, dead_lettered, woke from pgqueue.sweep()").fetchone()
        assert row is not None
        self.sweeps += 1
        self.rescued += row[0]
        self.dead_lettered += row[1]
        self.woke += row[2]


def unfinished(db: psycopg.Connection) -> int:
    row = db.execute(
        "select count(*) from pgqueue.all_jobs where status in ('queued', 'running')"
    ).fetchone()
    assert row is not None
    return row[0]


def wait_drained(dsn: str, timeout: float, interval: float = 0.25) -> float:
    """Seconds until no job is queued or running. Reconnects when the server goes away (the
    restart test restarts it meanwhile)."""
    started = time.monotonic()
    conn: psycopg.Connection | None = None
    try:
        while True:
            try:
                if conn is None or conn.closed or conn.broken:
                    conn = psycopg.connect(dsn, autocommit=True, connect_timeout=2)
                if unfinished(conn) == 0:
                    return time.monotonic() - started
            except psycopg.OperationalError:
                conn = None
            if time.monotonic() - started > timeout:
                with psycopg.connect(dsn, autocommit=True) as check:
                    left = unfinished(check)
                pytest.fail(f"the queue did not drain in {timeout}s: {left} jobs left")
            time.sleep(interval)
    finally:
        if conn is not None:
            conn.close()


@dataclass
class Execution:
    attempt: int
    event: str
    worker: str
    t: float


def executions(audit_dir: Path) -> dict[int, list[Execution]]:
    """Every execution event the handlers logged, per job, in order of time."""
    runs: dict[int, list[Execution]] = defaultdict(list)
    for path in audit_dir.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            if not line.endswith("}"):
                continue  # a line cut short by kill -9 can only be the last one of its file
            entry = json.loads(line)
            runs[entry["job"]].append(
                Execution(entry["attempt"], entry["event"], entry["worker"], entry["t"])
            )
    for events in runs.values():
        events.sort(key=lambda e: e.t)
    return runs


@dataclass
class Audit:
    """The outcome of every enqueued job, checked against the handlers' own logs."""

    jobs: int = 0
    done: int = 0
    failed: int = 0
    retried: int = 0  # jobs that needed more than one attempt
    attempts: int = 0
    missing: list[int] = field(default_factory=list)
    unfinished: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    # jobs whose handler finished twice because the first finish was never reported (its
    # worker was killed, or the server restarted, before complete): at-least-once at work
    rerun_after_fault: int = 0

    @property
    def lost(self) -> int:
        return len(self.missing) + len(self.unfinished)

    def check(self) -> None:
        assert not self.missing, f"{len(self.missing)} jobs missing: {self.missing[:10]}"
        assert not self.unfinished, (
            f"{len(self.unfinished)} jobs not finished: {self.unfinished[:10]}"
        )
        assert not self.problems, f"{len(self.problems)} problems:\n" + "\n".join(
            self.problems[:20]
        )


def audit(
    db: psycopg.Connection,
    ids: list[int],
    audit_dir: Path,
    plan: Plan | None = None,
    faulty_run: object = None,
) -> Audit:
    """Each enqueued job is in a terminal state exactly once, with its attempts and errors
    recorded, none missing, none done twice.

    Without faults (`faulty_run` None) the check is exact: the handler started once per
    counted attempt, finished once, and the job ended as the plan says. With faults,
    `faulty_run(execution)` says whether an execution was cut off by one (its worker was
    killed, the server restarted under it): such an attempt may be counted without a log
    line, may have finished without being reported (then the job runs again), and may have
    used up an attempt the plan did not expect."""
    result = Audit(jobs=len(ids))
    rows = {
        row[0]: row[1:]
        for row in db.execute(
            "select id, status, attempts, max_attempts, last_error, finished_at, lock_token"
            " from pgqueue.all_jobs where id = any(%s)",
            (ids,),
        )
    }
    extra = db.execute(
        "select count(*) from pgqueue.all_jobs where not (id = any(%s))", (ids,)
    ).fetchone()
    if extra and extra[0]:
        result.problems.append(f"{extra[0]} jobs in the table that nobody enqueued")
    runs = executions(audit_dir)
    expected = {job_id: plan.expected(i) for i, job_id in enumerate(ids)} if plan else {}
    planned_max = {job_id: plan.jobs[i][2] for i, job_id in enumerate(ids)} if plan else {}
    problem = result.problems.append
    for job_id in ids:
        row = rows.get(job_id)
        if row is None:
            result.missing.append(job_id)
            continue
        status, attempts, max_attempts, last_error, finished_at, lock_token = row
        # a done job kept by batch (done_batches) keeps neither its max_attempts nor an error
        batched = status == "done" and max_attempts is None
        if batched:
            max_attempts = planned_max.get(job_id)
        result.attempts += attempts
        if status not in TERMINAL:
            result.unfinished.append(job_id)
            continue
        if finished_at is None or lock_token is not None:
            problem(f"job {job_id}: {status} without finished_at, or still holding a lease")
        events = runs.get(job_id, [])
        started = [e.attempt for e in events if e.event == "start"]
        finished = [e for e in events if e.event == "ok"]
        if len(started) != len(set(started)):
            problem(f"job {job_id}: one attempt started twice (a double claim): {started}")
        if started and max(started) > attempts:
            problem(f"job {job_id}: attempt {max(started)} ran but {attempts} were counted")
        if max_attempts is not None and attempts > max_attempts:
            problem(f"job {job_id}: {attempts} attempts, more than its {max_attempts}")
        if attempts > 1:
            result.retried += 1
            if not last_error and not batched:
                problem(f"job {job_id}: {attempts} attempts but no error recorded")
        cut_off = faulty_run is not None and any(
            faulty_run(e) for e in events if e.event == "start"
        )
        if status == "done":
            result.done += 1
            if not finished or finished[-1].attempt != attempts:
                problem(f"job {job_id}: done, but attempt {attempts} never finished")
            unreported = [e for e in finished[:-1] if not (faulty_run and faulty_run(e))]
            if unreported:
                problem(f"job {job_id}: done twice: {[(e.attempt, e.worker) for e in finished]}")
            if len(finished) > 1:
                result.rerun_after_fault += 1
        elif status == "failed":
            result.failed += 1
            if not last_error:
                problem(f"job {job_id}: failed without an error recorded")
            if finished:
                problem(
                    f"job {job_id}: failed, but its handler finished at attempt(s) "
                    f"{[e.attempt for e in finished]}"
                )
        never_ran = status == "failed" and (last_error or "").startswith("invalid payload")
        if faulty_run is None and len(started) != attempts and not never_ran:
            problem(f"job {job_id}: {attempts} attempts counted, {len(started)} ran")
        if job_id in expected:
            want_status, want_attempts = expected[job_id]
            if (status, attempts) != (want_status, want_attempts):
                # a fault may use up attempts: a killed run, or a claim whose worker died
                # before the handler started (counted, never logged), or a rescued lease
                faulted = (
                    cut_off or attempts > len(set(started)) or "lease expired" in (last_error or "")
                )
                if faulty_run is None or not faulted or attempts < want_attempts:
                    problem(
                        f"job {job_id}: {status} after {attempts} attempts, expected "
                        f"{want_status} after {want_attempts} (last error: {last_error})"
                    )
            elif want_status == "failed" and not (last_error or "").startswith(
                "RuntimeError: chaos"
            ):
                problem(f"job {job_id}: dead-lettered with error {last_error!r}")
    return result
