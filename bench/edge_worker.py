"""The Edge Function worker's own cost (issue 49): `edge_drain_noop`, `edge_drain_cpu_1ms`,
`edge_trickle`, `edge_idle`.

The rendered Edge Function runs under `deno run` (as tests/edge/deno_worker.py starts it),
through the PostgREST stand-in, woken by the real pg_net. Its CPU is the Deno process's (user +
system from /proc, every thread): what the runtime would count against the isolate.

- `edge_drain_noop`, `edge_drain_cpu_1ms`: `jobs` jobs (2,000) enqueued by one statement (so one
  wake-up), no-op or each holding the thread for 1 ms of CPU: jobs/s from the enqueue to the
  last job done, and the function's CPU a job.
- `edge_trickle`: one job every TRICKLE_EVERY seconds for `minute` seconds (60; each its own
  enqueue and wake-up): the function's CPU a minute, what lingering between jobs costs.
- `edge_idle`: one wake-up with nothing queued, then nothing for `minute` seconds: the
  function's CPU a minute.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg

from .generated_worker import StandIn
from .queue_sql import reset
from .stack import SCHEMA, Stack
from .wakeups import register_edge_handler

Figures = dict[str, float]

TRICKLE_EVERY = 1.5
SCENARIOS = ("edge_drain_noop", "edge_drain_cpu_1ms", "edge_trickle", "edge_idle")
# One `deno run` process stands for one isolate; its per-isolate limits (wall clock, time
# budget, CPU budget) are lifted for the drains, which measure the worker's own cost a job:
# under the runtime's limits one isolate takes a slice of such a drain and the sweeper's
# re-wake starts the next.
UNLIMITED = {
    "PGQUEUE_WALL_CLOCK_LIMIT_SECONDS": "400",  # the most the settings take
    "PGQUEUE_TIME_BUDGET_SECONDS": "360",
    "PGQUEUE_CPU_SOFT_LIMIT_MS": "3000000",
    "PGQUEUE_CPU_HARD_LIMIT_MS": "3600000",
}

# The job kind that holds the thread for payload.cpuMs, added to the function's handlers/.
CPU_HANDLER = Path(__file__).parent / "handlers" / "bench_cpu.ts"


def install(project: Path) -> str | None:
    """Add the CPU-holding handler to the rendered Edge Function (the no-op one comes from
    wakeups.install_edge()); None when it is ready, else what is wrong."""
    return register_edge_handler(project, CPU_HANDLER, "benchCpu", "cpu")


def cpu_s(pid: int) -> float:
    """User + system CPU time of process `pid`, all its threads (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(
    stack: Stack,
    name: str,
    standin: StandIn,
    settings: dict[str, str],
    jobs: int,
    minute: float,
) -> Figures:
    from deno import find_deno_bin

    from testkit.stack import point_wake_ups, wait_for_pg_net
    from tests.edge.deno_worker import FUNCTION, Deno, start_edge_worker, stop_edge_worker

    reset(stack)
    deno = Deno(find_deno_bin(), Path(os.environ.get("DENO_DIR") or Path(sys.prefix) / "deno"))
    api: Any = SimpleNamespace(url=standin.url)  # start_edge_worker reads only its URL
    function_dir = stack.projects["edge"] / "supabase" / "functions" / FUNCTION
    worker = start_edge_worker(deno, function_dir, api, **UNLIMITED, **settings)
    pid = worker.process.pid
    try:
        with psycopg.connect(stack.dsn(), autocommit=True) as conn:
            conn.execute("truncate net._http_response")
            point_wake_ups(conn, worker.url, worker.wake_secret)
            time.sleep(1)  # the function's start-up CPU is not the figure
            began, cpu = time.monotonic(), cpu_s(pid)
            if name.startswith("edge_drain"):
                payload = {"cpuMs": 1} if name == "edge_drain_cpu_1ms" else {}
                kind = "cpu" if payload else "noop"
                conn.execute(
                    f"insert into {SCHEMA}.jobs (kind, payload) "
                    "select %s, %s::jsonb from generate_series(1, %s)",
                    (kind, psycopg.types.json.Jsonb(payload), jobs),
                )
                _wait_done(conn, jobs, timeout=300)
                took, used = time.monotonic() - began, cpu_s(pid) - cpu
                return {"jobs_per_s": jobs / took, "cpu_us_per_job": used / jobs * 1e6}
            if name == "edge_trickle":
                sent = 0
                while time.monotonic() - began < minute:
                    conn.execute(f"select {SCHEMA}.enqueue('noop')")
                    sent += 1
                    time.sleep(TRICKLE_EVERY)
                _wait_done(conn, sent, timeout=60)
            else:  # edge_idle: one wake-up, nothing queued
                conn.execute(f"select {SCHEMA}._wake('bench idle', array['default'])")
                wait_for_pg_net(conn, timeout=30)
                time.sleep(max(0.0, minute - (time.monotonic() - began)))
            took, used = time.monotonic() - began, cpu_s(pid) - cpu
            return {"cpu_ms_per_minute": used * 1000 * 60 / took}
    finally:
        stop_edge_worker(worker)


def _wait_done(conn: psycopg.Connection, jobs: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = conn.execute(
            f"select count(*) from {SCHEMA}.all_jobs where status = 'done'"
        ).fetchone()[0]
        if done >= jobs:
            return
        time.sleep(0.05)
    raise RuntimeError(f"the Edge Function finished {done} of {jobs} jobs in {timeout:.0f} s")
