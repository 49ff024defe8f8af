"""Issue 35, point 6: a project created at 0.1.0 (python worker, postgres transport) takes the
1.0.0 upgrade while its 0.1.0 workers drain a backlog and a producer enqueues every 10 ms; and
(last test) the previous release's claimers keep claiming through the current release's step.

The scenario, with real components throughout: 0.1.0 rendered and pushed to a fresh cluster
with the Supabase CLI; a backlog of BACKLOG jobs enqueued with 0.1.0's enqueue_many(); two of
the project's own 0.1.0 worker processes running it (the `upgrade_probe` handler added, which
records every run in a file per process); a producer thread calling 0.1.0's enqueue() on its
own connection, as the 0.1.0 postgres transport sends it, every PRODUCER_INTERVAL. While all of
that runs, `copier update` to HEAD and `supabase db push`. The workers and the producer go on
for AFTER_PUSH seconds, then the producer stops and the workers drain what is left.

What must hold (docs/upgrading.md, "What is tested"):
- the push succeeds on the first try;
- every job enqueued (the backlog and each of the producer's) is done, with one attempt, read
  through 1.0.0's `all_jobs`, and its handler ran exactly once (the probe's records): none
  lost, none run twice;
- no enqueue() call took MAX_ENQUEUE_LATENCY or more, and none failed;
- both 0.1.0 worker processes are still running at the end (not exited), and each completed
  jobs after the push;
- what the 0.1.0 workers may log meanwhile: the warnings they recover from on their own
  (`worker.unavailable`: a claim refused with an OperationalError, such as a lock or statement
  timeout, retried with backoff; `job.heartbeat_failed`; `listen.reconnect`). Nothing at error
  level: a 0.1.0 worker logs `job.unrecorded` when the queue refuses a complete_many() or a
  fail() (the job then runs again after its lease), and exits when a claim fails with anything
  else than an OperationalError (a ProgrammingError such as DatatypeMismatch, a
  NotSupportedError such as "cached plan must not change result type").

Figures (push time, enqueue max and p99, jobs run during the push, the workers' log lines above
INFO) are printed on one line starting with "[upgrade under load]" (pytest -s shows it).
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg.types.json import Jsonb

from testkit.cluster import Cluster
from testkit.hosted import start_hosted_cluster
from testkit.project import (
    SUPABASE_CLI,
    previous_release,
    push_migrations,
    release_refs,
    release_version,
    render_repo,
    update,
    variant,
)
from testkit.stack import start_supabase_like_cluster
from tests.support.schema import PINS_ITS_PATH, differences, queue_schema
from tests.support.workers import HANDLERS, Installed, Workers, with_handlers

PYTHON_POSTGRES = variant("python", "postgres")
KIND = "upgrade_probe"
PROBE = HANDLERS / "upgrade_probe.py"

BACKLOG = 40_000
# Each run of the probe takes this long (its I/O, say): two workers of concurrency 10 then run
# up to 2,000 jobs a second, so the backlog lasts through the update and the push.
HANDLER_SECONDS = 0.01
PRODUCER_INTERVAL = 0.01
# How long the workers and the producer go on after the push
AFTER_PUSH = 5.0
# The bound on the drain once the producer has stopped (about 30 s here when the workers live)
DRAIN_TIMEOUT = 120.0
MAX_ENQUEUE_LATENCY = 1.0
# The workers' log lines they recover from (see the module's docstring)
RECOVERED = {"worker.unavailable", "job.heartbeat_failed", "listen.reconnect"}

# enqueue() as 0.1.0's postgres transport sends it (PostgresQueue.enqueue at 70dac05):
# every argument by name, prepared.
ENQUEUE_0_1_0 = (
    "select pgqueue.enqueue(kind => %(kind)s, payload => %(payload)s,"
    " run_after => %(run_after)s, idempotency_key => %(key)s, queue => %(queue)s,"
    " priority => %(priority)s, max_attempts => %(max_attempts)s) as id"
)


@dataclass
class Producer:
    """Calls 0.1.0's enqueue() every `interval` on a connection of its own, from a thread,
    until stop(): each call's id and latency, and each error, kept in order."""

    dsn: str
    interval: float = PRODUCER_INTERVAL
    ids: list[int] = field(default_factory=list)
    # (time.time() at the call's start, seconds it took)
    calls: list[tuple[float, float]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="producer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()
        assert self._thread is not None
        self._thread.join(timeout=60)
        assert not self._thread.is_alive(), "the producer's enqueue() has hung for a minute"

    def _run(self) -> None:
        conn: psycopg.Connection | None = None
        n = 0
        while not self.stopping.is_set():
            began, t0 = time.time(), time.perf_counter()
            try:
                if conn is None or conn.closed or conn.broken:
                    conn = psycopg.connect(self.dsn, autocommit=True)
                params = {
                    "kind": KIND,
                    "payload": Jsonb({"n": BACKLOG + n}),
                    "run_after": None,
                    "key": None,
                    "queue": "default",
                    "priority": 0,
                    "max_attempts": None,
                }
                row = conn.execute(ENQUEUE_0_1_0, params, prepare=True).fetchone()
                assert row is not None
                self.ids.append(row[0])
                n += 1
            except psycopg.Error as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
            took = time.perf_counter() - t0
            self.calls.append((began, took))
            self.stopping.wait(max(0.0, self.interval - took))
        if conn is not None:
            conn.close()


def enqueue_backlog(cluster: Cluster, count: int) -> list[int]:
    """`count` jobs through 0.1.0's enqueue_many(), 5,000 a statement."""
    ids: list[int] = []
    with cluster.connect(autocommit=True) as db:
        for start in range(0, count, 5000):
            jobs = [
                {"kind": KIND, "payload": {"n": n}} for n in range(start, min(count, start + 5000))
            ]
            ids += [i for (i,) in db.execute("select pgqueue.enqueue_many(%s)", (Jsonb(jobs),))]
    return ids


def job_states(cluster: Cluster, ids: list[int]) -> dict[int, tuple[str, int]]:
    """(status, attempts) of each job: read through 1.0.0's all_jobs, or, while the database is
    still at 0.1.0 (a push that failed), from 0.1.0's jobs table."""
    with cluster.connect(autocommit=True) as db:
        (upgraded,) = db.execute("select to_regclass('pgqueue.all_jobs')").fetchone()
        rows = db.execute(
            f"select id, status, attempts from pgqueue.{'all_jobs' if upgraded else 'jobs'}"
            " where id = any(%s)",
            (ids,),
        )
        return {job_id: (status, attempts) for job_id, status, attempts in rows}


def runs(probe_dir: Path) -> list[dict]:
    """Every run the probe handler recorded, in any worker process."""
    return [
        json.loads(line)
        for path in sorted(probe_dir.glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]


def worker_errors(log: Path) -> Counter[str]:
    """What a worker logged above INFO, by event ("worker.unavailable": 2), and the exception
    that ended it, if one did ("exit: psycopg.errors.DatatypeMismatch: ...")."""
    found: Counter[str] = Counter()
    for text in log.read_text().splitlines():
        try:
            line = json.loads(text)
        except json.JSONDecodeError:
            # A traceback's last line names the exception: "module.Class: message"
            notes = ("DETAIL", "CONTEXT", "HINT", "QUERY")  # what follows a psycopg error
            if re.match(r"^[\w.]+: ", text) and not text.startswith(notes):
                found[f"exit: {text[:300]}"] += 1
            continue
        if line.get("level") not in ("debug", "info"):
            found[str(line.get("event", line.get("msg")))] += 1
    return found


def db_push(project: Path, cluster: Cluster) -> subprocess.CompletedProcess[str]:
    """`supabase db push` of the project's migrations, its outcome kept (not raised)."""
    return subprocess.run(
        [SUPABASE_CLI, "db", "push", "--db-url", cluster.url(), "--yes"],
        cwd=project,
        env={**os.environ, "DO_NOT_TRACK": "1"},
        capture_output=True,
        text=True,
    )


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else 0.0


def test_a_0_1_0_project_takes_the_1_0_0_upgrade_under_load(
    history: Path, interpreter: Path, tmp_path: Path
) -> None:
    project = render_repo(
        history,
        tmp_path / "app",
        "generated at 0.1.0",
        vcs_ref=release_refs()[0],
        **PYTHON_POSTGRES.answers,
    )
    # The 0.1.0 workers run from a copy of src/ made now: the update rewrites the project's.
    src = with_handlers(project / "src", tmp_path / "workers-0.1.0" / "src", PROBE)
    probe_dir = tmp_path / "runs"
    probe_dir.mkdir()

    cluster = start_supabase_like_cluster()
    workers = Workers(
        Installed(PYTHON_POSTGRES, project, interpreter, src),
        {
            "DB_URL": cluster.dsn(),
            "UPGRADE_PROBE_DIR": str(probe_dir),
            "LOG_LEVEL": "WARNING",
            "UPGRADE_PROBE_SLEEP": str(HANDLER_SECONDS),
        },
        tmp_path,
    )
    producer = Producer(cluster.dsn())
    try:
        push_migrations(project, cluster.url())
        backlog = enqueue_backlog(cluster, BACKLOG)
        started = [workers.start(ready=False, WORKER_NAME=f"w{i}") for i in range(2)]
        producer.start()
        time.sleep(2)  # the workers are draining, the producer enqueuing

        t0 = time.monotonic()
        update(project, "HEAD")
        update_s = time.monotonic() - t0
        with cluster.connect(autocommit=True) as db:
            # 0.1.0 keeps finished jobs in its jobs table, which the migration moves out
            queued_at_push, rows_at_push = db.execute(
                "select count(*) filter (where status = 'queued'), count(*) from pgqueue.jobs"
            ).fetchone()
        before_push = queue_schema(cluster, "pgqueue")
        push_began = time.time()
        push = db_push(project, cluster)
        push_ended = time.time()
        # A push that fails must change nothing
        changed_by_failed_push = (
            differences(before_push, queue_schema(cluster, "pgqueue")) if push.returncode else []
        )
        time.sleep(AFTER_PUSH)
        producer.stop()

        enqueued = backlog + producer.ids
        # The drain, bounded: until every job is done, or no worker is left to run them
        deadline = time.monotonic() + DRAIN_TIMEOUT
        while time.monotonic() < deadline and any(w.proc.poll() is None for w in started):
            done = [s for s in job_states(cluster, enqueued).values() if s[0] == "done"]
            if len(done) == len(enqueued):
                break
            time.sleep(0.5)
        exited = {w.log.name: w.proc.poll() for w in started if w.proc.poll() is not None}
        for w in started:
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGTERM)
        for w in started:
            w.wait(60)

        states = job_states(cluster, enqueued)
    finally:
        producer.stopping.set()
        workers.kill_all()
        cluster.destroy()

    recorded = runs(probe_dir)
    times = Counter(r["job"] for r in recorded)
    latencies = [took for _, took in producer.calls]
    push_s = push_ended - push_began
    during_push = sum(push_began <= r["t"] <= push_ended for r in recorded)
    after_push = Counter(r["worker"] for r in recorded if r["t"] > push_ended)
    logged = {w.log.name: worker_errors(w.log) for w in started}
    print(
        "[upgrade under load]",
        f"backlog={BACKLOG} producer_jobs={len(producer.ids)} update_s={update_s:.1f}",
        f"queued_at_push={queued_at_push} rows_at_push={rows_at_push}",
        f"push_ok={push.returncode == 0} push_s={push_s:.1f}",
        f"runs_during_push={during_push} runs_after_push={dict(after_push)}",
        f"enqueue_max_ms={max(latencies, default=0) * 1000:.0f}",
        f"enqueue_p99_ms={percentile(latencies, 0.99) * 1000:.0f}",
        f"enqueue_p50_ms={statistics.median(latencies or [0]) * 1000:.1f}",
        f"enqueue_errors={len(producer.errors)} exited={exited}",
        f"worker_errors={ {name: dict(counts) for name, counts in logged.items()} }",
        flush=True,
    )

    # Every requirement is checked, and every one that fails is named in one message.
    problems = []
    if push.returncode != 0:
        problems.append(
            f"supabase db push failed on the first try (after {push_s:.1f}s):\n"
            f"{push.stdout}{push.stderr}"
        )
        if changed_by_failed_push:
            problems.append(f"the failed push changed the schema: {changed_by_failed_push}")
    if exited:
        problems.append(f"0.1.0 workers exited (exit codes): {exited}")
    unexpected = {
        name: {line: n for line, n in counts.items() if line not in RECOVERED}
        for name, counts in logged.items()
    }
    if any(unexpected.values()):
        problems.append(f"the 0.1.0 workers logged more than they recover from: {unexpected}")
    if producer.errors:
        problems.append(f"{len(producer.errors)} enqueue() calls failed: {producer.errors[:3]}")
    slow = [
        f"{took:.2f}s at push{began - push_began:+.1f}s"
        for began, took in producer.calls
        if took >= MAX_ENQUEUE_LATENCY
    ]
    if slow:
        problems.append(f"{len(slow)} enqueue() calls took {MAX_ENQUEUE_LATENCY}s or more: {slow}")
    not_done = Counter(str(states.get(i)) for i in enqueued if states.get(i) != ("done", 1))
    if not_done:
        problems.append(
            f"{sum(not_done.values())} of {len(enqueued)} jobs are not done in one attempt"
            f" (status, attempts): {dict(not_done)}"
        )
    twice = {i: n for i, n in times.items() if n > 1}
    if twice:
        problems.append(f"{len(twice)} jobs ran more than once: {dict(list(twice.items())[:10])}")
    if set(times) - set(enqueued):
        problems.append(f"jobs nobody enqueued ran: {sorted(set(times) - set(enqueued))[:10]}")
    if set(after_push) != {"w0", "w1"}:
        problems.append(f"not every 0.1.0 worker ran jobs after the push: {dict(after_push)}")
    assert problems == [], "\n".join(problems) + "".join(
        f"\n--- {w.log.name} (its last lines)\n{w.output()[-3000:]}" for w in started
    )


def test_the_upgrade_gives_up_on_a_held_table_changes_nothing_and_lets_enqueues_through(
    history: Path, tmp_path: Path
) -> None:
    """A transaction that holds the job table (here a reader left idle in its transaction)
    keeps the 1.0.0 step from its lock: the push stops with a message that says what to do,
    and changes nothing. Meanwhile enqueues get through between its tries (each waits at most
    one try of 200 ms); once the holder is gone, the same push completes."""
    project = render_repo(
        history,
        tmp_path / "app",
        "generated at 0.1.0",
        vcs_ref=release_refs()[0],
        **PYTHON_POSTGRES.answers,
    )
    cluster = start_supabase_like_cluster()
    producer = Producer(cluster.dsn())
    try:
        push_migrations(project, cluster.url())
        update(project, "HEAD")
        before = queue_schema(cluster, "pgqueue")
        with cluster.connect() as holder:
            holder.execute("select count(*) from pgqueue.jobs")  # ACCESS SHARE, kept open
            producer.start()
            push = db_push(project, cluster)
            producer.stop()
            holder.rollback()
        after = queue_schema(cluster, "pgqueue")
        push_migrations(project, cluster.url())
        with cluster.connect() as db:
            (claims,) = db.execute("select to_regclass('pgqueue.claims') is not null").fetchone()
    finally:
        producer.stopping.set()
        cluster.destroy()

    output = push.stdout + push.stderr
    assert push.returncode != 0
    assert "could not lock pgqueue.jobs in 50 tries of 200 ms; nothing was changed" in output
    assert "SQLSTATE 55P03" in output
    assert "pg_stat_activity" in output, "the hint says where to look"
    assert differences(before, after) == []
    assert producer.errors == []
    assert len(producer.calls) > 100, "the producer enqueued throughout the push's tries"
    assert max(took for _, took in producer.calls) < 0.5
    assert claims, "the push went through once the table was free"


# The current release's step under the previous release's claimers: how many claim at once,
# and what each takes a call
CLAIMERS = 4
CLAIM_BATCH = 25


def test_claimers_of_the_previous_release_keep_claiming_through_the_step(
    history: Path, tmp_path: Path
) -> None:
    """The current release's step (from the release before it, previous_release(), so also once
    the current release is cut) alters the functions the previous release's claimers call,
    and (1.3.0's) the job and claim tables, which it locks first. Four connections loop the
    previous release's complete_and_claim() over jobs stored as rows, which a producer keeps
    enqueuing, while `copier update` and `supabase db push` run on a hosted-shaped cluster:
    the push succeeds, no call fails but those the step cancels (a call caught waiting on its
    locks, which a worker retries as a lost connection), and every job is completed exactly
    once."""
    previous = previous_release()
    project = render_repo(
        history,
        tmp_path / "app",
        f"generated at {release_version(previous)}",
        vcs_ref=previous,
        **PYTHON_POSTGRES.answers,
    )
    cluster = start_hosted_cluster()
    enqueued: list[int] = []
    completed: Counter[int] = Counter()
    errors: list[BaseException] = []
    cancelled: list[str] = []  # the claimers whose call the step cancelled, once a call
    pushed = threading.Event()  # the producer stops
    produced = threading.Event()  # its last jobs are in: the claimers stop once it is empty
    lock = threading.Lock()

    def produce() -> None:
        with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
            while not pushed.is_set():
                ids = conn.execute(
                    "insert into pgqueue.jobs (kind, payload)"
                    " select 'probe', jsonb_build_object('n', n) from generate_series(1, 50) n"
                    " returning id"
                ).fetchall()
                with lock:
                    enqueued.extend(i for (i,) in ids)
                time.sleep(0.01)

    def claim(name: str) -> None:
        try:
            # as a worker connects: as postgres, the role that pushes (and may cancel)
            with psycopg.connect(cluster.dsn(user="postgres"), autocommit=True) as conn:
                done: list[tuple[int, str]] = []
                while True:
                    try:
                        rows = conn.execute(
                            "select id, lock_token::text from pgqueue.complete_and_claim("
                            "%s, %s::bigint[], %s::uuid[], %s)",
                            (name, [i for i, _ in done], [t for _, t in done], CLAIM_BATCH),
                        ).fetchall()
                    except psycopg.errors.QueryCanceled:
                        # the step cancels the calls caught waiting on its locks: a worker of
                        # the previous release takes that for a lost connection (an
                        # OperationalError) and makes the same call again after its first
                        # backoff (0.5 s), as here
                        with lock:
                            cancelled.append(name)
                        time.sleep(0.5)
                        continue
                    with lock:
                        completed.update(i for i, _ in done)
                    done = rows
                    if not rows:
                        if produced.is_set():
                            return
                        time.sleep(0.005)  # an empty queue: poll, as a worker would
        except BaseException as error:  # (the test reports it)
            errors.append(error)

    try:
        push_migrations(project, cluster.url())
        producer = threading.Thread(target=produce)
        claimers = [threading.Thread(target=claim, args=(f"w{n}",)) for n in range(CLAIMERS)]
        for thread in [producer, *claimers]:
            thread.start()
        try:
            update(project, "HEAD")
            push = db_push(project, cluster)
        finally:
            pushed.set()
            producer.join(timeout=60)
            produced.set()
            for thread in claimers:
                thread.join(timeout=60)
        with cluster.connect() as db:
            # 1.2.0's step pins every function's search_path
            (steps,) = db.execute(
                "select proconfig @> array['search_path=pg_catalog, pg_temp'] from pg_proc"
                " where oid = 'pgqueue.complete_and_claim(text, bigint[], uuid[], integer, text[],"
                " text, integer, jsonb[])'::regprocedure"
            ).fetchone()
            # and the current one every function's, but the inlined helpers' (PINS_ITS_PATH)
            unpinned = db.execute(
                "select array_agg(p.proname) from pg_proc as p where p.pronamespace in"
                " ('pgqueue'::regnamespace, 'pgqueue_public'::regnamespace)"
                f" and not ({PINS_ITS_PATH})"
            ).fetchone()[0]
            left = db.execute("select count(*) from pgqueue.live_jobs").fetchone()[0]
    finally:
        cluster.destroy()

    assert push.returncode == 0, push.stdout + push.stderr
    assert steps, "the push applied the current release's step"
    assert unpinned is None
    assert errors == []
    assert left == 0
    assert len(enqueued) > 1_000, "the producer enqueued throughout the update and the push"
    assert set(completed) == set(enqueued)
    assert max(completed.values()) == 1, "no job completed twice"
    assert len(cancelled) <= CLAIMERS, cancelled
    assert {n for n in completed.values()} == {1}, "no job completed twice"
