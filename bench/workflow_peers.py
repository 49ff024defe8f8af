"""pgflow, the workflow peer (issue 51): its SQL core driven from SQL, as the pgmq peer is.

pgflow is npm `@pgflow/core`, pinned in bench/package.json and installed into
bench/node_modules by bench/run (`npm ci`); its migrations (dist/supabase/migrations/*.sql)
are applied, in order, to the `pgflow` database of the benchmark's cluster, on the vendored
pgmq 1.5.1, after bench/realtime_standin.sql (pgflow broadcasts every event through Supabase
Realtime's realtime.send(), which this machine lacks; see that file).

Two flows, defined with pgflow.create_flow() and pgflow.add_step() as pgflow's DSL compiles
them:
- `bench_chain`: a -> b -> c, 3 tasks a run;
- `bench_fanin`: `child`, a map step over the run's input (an array of FANIN_CHILDREN numbers,
  so FANIN_CHILDREN tasks), then `fanin`, a single step that depends on it and is given all the
  children's outputs: FANIN_CHILDREN + 1 tasks a run. A map step is pgflow's own way to run
  N tasks of one kind at once and join them (100 named steps would be 100 step definitions
  and 100 step states a run where pgflow has one).

A scenario starts `runs` runs (pgflow.start_flow(), one call and transaction each, timed
apart: start_runs_per_s), then `processes` processes drain them. Each loops what pgflow's
Edge worker (@pgflow/edge-worker 0.8, createFlowWorker) does for a task, with no handler
work: pgmq.read_with_poll(flow, 2, 10, 2, 100) (its visibility timeout, batch, max poll
seconds and poll interval defaults), pgflow.start_tasks(flow, msg_ids, worker_id), then
pgflow.complete_task(run_id, step_slug, task_index, OUTPUT) for each task started, each call
its own transaction, until a read finds nothing for its max poll seconds. Each process
registers as a worker (a row in pgflow.workers, which start_tasks references) and warms up on
a run of its own of a one-step flow before the go. Figures: steps_per_s (tasks completed a
second, from the go to the last completion), runs_per_s, start_runs_per_s, and
server_cpu_us_per_step (the drain's backends' CPU time over its tasks). Afterwards every run
must be completed, each task completed at its first attempt and its message archived once, or
the scenario fails.

Our side (`workflow_chain_{1,4}proc`, `workflow_fanin_{1,4}proc`, still to come) is
comparable when it: runs as many runs (Sizes.chain_runs and Sizes.fanin_runs in
bench/__main__.py) of the same shapes (3 jobs in a chain; FANIN_CHILDREN jobs, then one that
depends on all of them), each job completed with OUTPUT (the same JSON) and the dependent job
given its dependencies' results; creates the runs before the go (enqueue with depends_on,
timed apart as start_runs_per_s); drains them with 1 and 4 processes, a connection each,
warmed up before the go, claiming and completing through the SQL API only; reports the same
figures under the same names (steps_per_s counting every job, the fan-in job included); and
fails unless every job ran once. bench/report.py then compares each figure with this module's
(x pgflow), and issue 51 asks for at least 2x pgflow's steps_per_s.
"""

from __future__ import annotations

import json
import multiprocessing
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.synchronize import Event as EventType
from pathlib import Path
from typing import Any

import psycopg

from .queue_sql import array_literal, backend_cpu_s, gather_results
from .stack import REPO, Stack, wait_idle_autovacuum

DATABASE = "pgflow"
PACKAGE = REPO / "bench" / "node_modules" / "@pgflow" / "core"
MIGRATIONS = PACKAGE / "dist" / "supabase" / "migrations"
REALTIME_STANDIN = Path(__file__).with_name("realtime_standin.sql")

FANIN_CHILDREN = 100
OUTPUT = json.dumps({"ok": True})  # every task's output: small, as a no-op handler's

# What pgflow's Edge worker reads with (createFlowWorker's defaults): a visibility timeout of
# 2 s (start_tasks then sets the step's timeout + 2 s), 10 messages a read, polling in the
# database every 100 ms for up to 2 s.
VISIBILITY_S = 2
BATCH = 10
MAX_POLL_S = 2
POLL_INTERVAL_MS = 100

# PgflowSqlClient's calls (@pgflow/core dist/PgflowSqlClient.js), with their named arguments.
READ = (
    "select msg_id from pgmq.read_with_poll(queue_name => %s, vt => %s, qty => %s, "
    "max_poll_seconds => %s, poll_interval_ms => %s)"
)
START_TASKS = (
    "select * from pgflow.start_tasks(flow_slug => %s, msg_ids => %s::bigint[], "
    "worker_id => %s::uuid)"
)
COMPLETE_TASK = (
    "select pgflow.complete_task(run_id => %s::uuid, step_slug => %s::text, "
    "task_index => %s::int, output => %s::jsonb)"
)
START_FLOW = "select run_id from pgflow.start_flow(flow_slug => %s, input => %s::jsonb)"


@dataclass(frozen=True)
class Flow:
    slug: str
    definition: tuple[str, ...]  # the SQL that defines it
    tasks_per_run: int
    run_input: str  # each run's input (JSON)


CHAIN = Flow(
    "bench_chain",
    (
        "select pgflow.create_flow('bench_chain')",
        "select pgflow.add_step('bench_chain', 'a')",
        "select pgflow.add_step('bench_chain', 'b', array['a'])",
        "select pgflow.add_step('bench_chain', 'c', array['b'])",
    ),
    tasks_per_run=3,
    run_input=json.dumps({"n": 1}),
)
FANIN = Flow(
    "bench_fanin",
    (
        "select pgflow.create_flow('bench_fanin')",
        "select pgflow.add_step('bench_fanin', 'child', step_type => 'map')",
        "select pgflow.add_step('bench_fanin', 'fanin', array['child'])",
    ),
    tasks_per_run=FANIN_CHILDREN + 1,
    run_input=json.dumps(list(range(FANIN_CHILDREN))),
)
# each drain process warms up on a run of this one
WARM_UP = Flow(
    "bench_warm_up",
    ("select pgflow.create_flow('bench_warm_up')", "select pgflow.add_step('bench_warm_up', 'a')"),
    tasks_per_run=1,
    run_input=json.dumps({"n": 1}),
)
FLOWS = {"chain": CHAIN, "fanin": FANIN}


def install(stack: Stack) -> None:
    """pgmq created in the `pgflow` database as the pgmq peer's is, the Realtime stand-in, then
    pgflow's migrations in order (each in a transaction, as the Supabase CLI applies them) and
    the flows; once per stack."""
    if not MIGRATIONS.is_dir():
        raise RuntimeError(
            f"pgflow is not installed ({MIGRATIONS} is missing): run `bench/run --setup-only`, "
            "which installs bench/package-lock.json into bench/node_modules"
        )
    with stack.cluster.connect(DATABASE, autocommit=True) as conn:
        if conn.execute("select to_regclass('pgflow.flows')").fetchone()[0] is not None:
            return
        conn.execute("create extension if not exists pgmq")
    with stack.cluster.connect(DATABASE) as conn:
        with conn.transaction():
            conn.execute(REALTIME_STANDIN.read_text())
        for migration in sorted(MIGRATIONS.glob("*.sql")):
            with conn.transaction():
                conn.execute(migration.read_text())
        for flow in (CHAIN, FANIN, WARM_UP):
            with conn.transaction():
                for statement in flow.definition:
                    conn.execute(statement)
        conn.commit()


def reset(stack: Stack) -> None:
    """pgflow installed, no runs, tasks, workers, queued or archived messages or broadcasts left,
    and the tables vacuumed."""
    install(stack)
    queues = [f"pgmq.{kind}_{flow.slug}" for flow in (CHAIN, FANIN, WARM_UP) for kind in "qa"]
    runtime = ["pgflow.step_tasks", "pgflow.step_states", "pgflow.runs", "pgflow.workers"]
    tables = ", ".join([*runtime, *queues, "realtime.messages"])
    with stack.cluster.connect(DATABASE, autocommit=True) as conn:
        conn.execute(f"truncate {tables}")
        conn.execute(f"vacuum analyze {tables}")
    wait_idle_autovacuum(stack)


def start_runs(conn: psycopg.Connection, flow: Flow, runs: int) -> list[str]:
    """`runs` runs of `flow`, one pgflow.start_flow() call (and transaction) each."""
    return [
        str(conn.execute(START_FLOW, (flow.slug, flow.run_input), prepare=True).fetchone()[0])
        for _ in range(runs)
    ]


def work(
    conn: psycopg.Connection, flow: str, worker_id: str, batch: int = BATCH
) -> tuple[int, bool]:
    """One round of pgflow's worker loop on `flow`'s queue: read a batch, start its tasks,
    complete each with OUTPUT. The tasks completed, and whether the read found anything."""
    rows = conn.execute(
        READ, (flow, VISIBILITY_S, batch, MAX_POLL_S, POLL_INTERVAL_MS), prepare=True
    ).fetchall()
    if not rows:
        return 0, False
    ids = array_literal([msg_id for (msg_id,) in rows])
    cursor = conn.execute(START_TASKS, (flow, ids, worker_id), prepare=True)
    names = [column.name for column in cursor.description or ()]
    tasks = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    for task in tasks:
        conn.execute(
            COMPLETE_TASK,
            (task["run_id"], task["step_slug"], task["task_index"], OUTPUT),
            prepare=True,
        ).fetchall()
    return len(tasks), True


def register_worker(conn: psycopg.Connection, flow: str) -> str:
    """A worker's row, as the Edge worker writes it when it starts (start_tasks records it)."""
    worker_id = str(uuid.uuid4())
    conn.execute(
        "insert into pgflow.workers (worker_id, queue_name, function_name) values (%s, %s, %s)",
        (worker_id, flow, "bench"),
    )
    return worker_id


def _drain_loop(
    dsn: str,
    flow: str,
    ready: multiprocessing.Queue,
    go: EventType,
    out: multiprocessing.Queue,
) -> None:
    """A drain process: registers, warms up on a run of WARM_UP of its own, says it is ready,
    waits for the go, then works `flow`'s queue until a read finds nothing. Puts (tasks
    completed, when its last batch was done, its backend's CPU seconds up to then)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        worker_id = register_worker(conn, flow)
        # (one message a read: each process has started one run before it reads, so each
        # finds one, whichever it is)
        start_runs(conn, WARM_UP, 1)
        warmed, _ = work(conn, WARM_UP.slug, worker_id, batch=1)
        if warmed != 1:
            raise RuntimeError(f"the warm-up completed {warmed} tasks, not 1")
        pid = conn.execute("select pg_backend_pid()").fetchone()[0]
        ready.put(pid)
        go.wait()
        began = backend_cpu_s(pid)
        done, last, cpu = 0, time.perf_counter(), 0.0
        while True:
            completed, found = work(conn, flow, worker_id)
            if not found:
                break
            done += completed
            last, cpu = time.perf_counter(), backend_cpu_s(pid) - began
        out.put((done, last, cpu))


@dataclass
class Drained:
    """What drive() measured: each process's result, its first three (jobs completed, when its
    last completion was, its backend's CPU seconds up to then); when the go was given; how long
    starting the runs took and its CPU seconds; and what start() returned."""

    results: list[tuple]
    started: float
    start_s: float
    start_cpu_s: float
    runs: Any


def drive(
    dsn: str,
    target: Callable[..., None],
    names: list[str],
    start: Callable[[psycopg.Connection], Any],
) -> Drained:
    """One process per name running `target(dsn, name, ready, go, out)`: once each is ready
    (warmed up), the runs are started with start(conn), timed apart, then the go is given and
    each process's result gathered (ours and pgflow's sides alike)."""
    ctx = multiprocessing.get_context("fork")
    ready, go, out = ctx.Queue(), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=target, args=(dsn, name, ready, go, out)) for name in names]
    for proc in procs:
        proc.start()
    try:
        gather_results(ready, procs, timeout=120)
        with psycopg.connect(dsn, autocommit=True) as conn:
            pid = conn.info.backend_pid
            cpu, began = backend_cpu_s(pid), time.perf_counter()
            runs = start(conn)
            start_s, start_cpu = time.perf_counter() - began, backend_cpu_s(pid) - cpu
        started = time.perf_counter()
        go.set()
        results = gather_results(out, procs, timeout=900)
    finally:
        go.set()
        for proc in procs:
            proc.join(timeout=60)
    return Drained(results, started, start_s, start_cpu, runs)


def figures(drained: Drained, runs: int) -> dict[str, float]:
    """The figures of a drive() of `runs` runs, named alike on both sides."""
    steps = sum(result[0] for result in drained.results)
    elapsed = max(result[1] for result in drained.results) - drained.started
    return {
        "steps_per_s": steps / elapsed,
        "runs_per_s": runs / elapsed,
        "start_runs_per_s": runs / drained.start_s,
        "server_cpu_us_per_step": sum(result[2] for result in drained.results) / steps * 1e6,
        "start_server_cpu_us_per_run": drained.start_cpu_s / runs * 1e6,
    }


def drain(stack: Stack, shape: str, runs: int, processes: int) -> dict[str, float]:
    """`runs` runs of the `shape` flow ("chain" or "fanin") started, then drained by
    `processes` processes; checked afterwards (check())."""
    flow = FLOWS[shape]
    reset(stack)
    drained = drive(
        stack.dsn(DATABASE),
        _drain_loop,
        [flow.slug] * processes,
        lambda conn: start_runs(conn, flow, runs),
    )
    steps = sum(done for done, _, _ in drained.results)
    if steps != runs * flow.tasks_per_run:
        raise RuntimeError(f"pgflow {shape}: {steps} of {runs * flow.tasks_per_run} tasks done")
    check(stack, flow, runs)
    return figures(drained, runs)


def check(stack: Stack, flow: Flow, runs: int) -> None:
    """Every run of `flow` completed; each of its tasks completed at its first attempt, with
    OUTPUT; each task's message archived, none left queued."""
    with stack.cluster.connect(DATABASE) as conn:
        counts = conn.execute(
            "select count(*), count(*) filter (where status = 'completed' "
            "and remaining_steps = 0) from pgflow.runs where flow_slug = %s",
            (flow.slug,),
        ).fetchone()
        tasks = conn.execute(
            "select count(*), count(*) filter (where status = 'completed' "
            "and attempts_count = 1 and output = %s::jsonb), count(distinct message_id) "
            "from pgflow.step_tasks where flow_slug = %s",
            (OUTPUT, flow.slug),
        ).fetchone()
        queued = conn.execute(f"select count(*) from pgmq.q_{flow.slug}").fetchone()[0]
        archived = conn.execute(f"select count(*) from pgmq.a_{flow.slug}").fetchone()[0]
    expected = runs * flow.tasks_per_run
    if counts != (runs, runs) or tasks != (expected, expected, expected):
        raise RuntimeError(
            f"pgflow {flow.slug}: {counts[1]} of {counts[0]} runs completed (of {runs}); "
            f"{tasks[1]} of {tasks[0]} tasks completed once (of {expected}), "
            f"{tasks[2]} messages"
        )
    if queued or archived != expected:
        raise RuntimeError(
            f"pgflow {flow.slug}: {queued} messages left queued, {archived} archived "
            f"(of {expected})"
        )
