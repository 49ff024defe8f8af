"""The wake-up scenarios: each worker style that the database wakes over HTTP, woken by the
real pg_net (preloaded in the benchmark's cluster) and by nothing else but its own linger
(the idle poll is off: WORKER_POLL_INTERVAL=3600), under three load shapes in turn:
single-job enqueues (each its own statement and commit) at a steady 50/s and 200/s, then
isolated jobs, one every 2 s. Latency: from the start of the enqueue call to the handler's
start, per job.

- `wakeup_http_postgres`: the python-http worker, postgres transport (it lingers on LISTEN);
- `wakeup_http_supabase`: the python-http worker, supabase transport, through the PostgREST
  stand-in (it lingers with short polls);
- `wakeup_edge`: the Edge Function worker, run by Deno as tests/edge/deno_worker.py runs it,
  through the PostgREST stand-in (it lingers with short polls within its time budget).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import psycopg

from .generated_worker import StandIn, enqueue_steadily, latency_figures, read_starts
from .queue_sql import percentile, reset
from .stack import REPO, Stack

Figures = dict[str, float]

# Scenario -> the rendered project it runs (bench/stack.py renders them all).
PROJECTS = {
    "wakeup_http_postgres": "http",
    "wakeup_http_supabase": "http_supabase",
    "wakeup_edge": "edge",
}
# Issue 13's targets: p95 from the enqueue call to the handler's start, in ms, per scenario
# and load shape.
TARGETS_MS = {
    "wakeup_http_postgres": {"steady_50": 20, "steady_200": 20, "isolated": 20},
    "wakeup_http_supabase": {"steady_50": 100, "steady_200": 100, "isolated": 20},
    "wakeup_edge": {"steady_50": 200, "steady_200": 200, "isolated": 200},
}

# The no-op job kind for the edge worker, added to its handlers/ and registered in mod.ts.
EDGE_HANDLER = Path(__file__).parent / "handlers" / "bench_noop.ts"
_HANDLERS_LINE = "export const handlers = {"


@dataclass(frozen=True)
class Shape:
    name: str
    rate: float  # enqueues per second
    samples: int


def shapes(steady_50: int, steady_200: int, isolated: int, isolated_every: float) -> list[Shape]:
    return [
        Shape("steady_50", 50.0, steady_50),
        Shape("steady_200", 200.0, steady_200),
        Shape("isolated", 1 / isolated_every, isolated),
    ]


def install_edge(project: Path) -> str | None:
    """Add the no-op handler to the rendered Edge Function; None when it is ready, else what
    is wrong. (Deno needs no install: its npm packages are fetched on the first run.)"""
    return register_edge_handler(project, EDGE_HANDLER, "benchNoop", "noop")


def register_edge_handler(project: Path, source: Path, export: str, kind: str) -> str | None:
    """Copy `source` (a handler module exporting `export`) into the rendered Edge Function's
    handlers/ and register it for `kind` in mod.ts; None when it is ready, else what is wrong."""
    from tests.edge.deno_worker import FUNCTION

    handlers = project / "supabase" / "functions" / FUNCTION / "handlers"
    registry = handlers / "mod.ts"
    if not registry.is_file():
        return f"the rendered project has no {registry.relative_to(project)}"
    text = registry.read_text()
    if f"{kind}: {export}," in text:
        return None
    if _HANDLERS_LINE not in text:
        return f"{registry.relative_to(project)} has no line `{_HANDLERS_LINE}`"
    shutil.copy(source, handlers / source.name)
    registry.write_text(
        text.replace(
            _HANDLERS_LINE,
            f'import {{ {export} }} from "./{source.name}";\n\n{_HANDLERS_LINE}\n'
            f"  {kind}: {export},",
        )
    )
    return None


def python_http(
    stack: Stack,
    scenario: str,
    runs: list[Shape],
    standin: StandIn | None,
    linger: float | None,
) -> Figures:
    """The python-http worker of the scenario's project (`python -m <package> worker`, as a
    user starts it), woken by pg_net's POST /wake."""
    from testkit.cluster import free_port

    name = PROJECTS[scenario]
    reset(stack)
    starts = Path(tempfile.mkstemp(prefix="bench-starts-")[1])
    port = free_port()
    env = {
        "HOST": "127.0.0.1",
        "PORT": str(port),
        "LOG_LEVEL": "ERROR",  # not the health warnings about the paused sweeper
        "WORKER_POLL_INTERVAL": "3600",
        "BENCH_HANDLER_STARTS": str(starts),
    }
    # the secret wake-ups are signed with: one of its own, never the service key (which wake()
    # refuses), base64 as Standard Webhooks reads a secret (hex digits are)
    secret = os.urandom(32).hex()
    env["WAKE_SECRET"] = secret
    if standin is None:
        env |= {"DATABASE_URL": stack.dsn(), "SERVICE_ROLE_KEY": "bench-" + os.urandom(16).hex()}
    else:
        env |= {"SUPABASE_URL": standin.url, "SERVICE_ROLE_KEY": standin.key}
    if linger is not None:
        env["WORKER_LINGER_SECONDS"] = str(linger)
    worker = subprocess.Popen(
        [sys.executable, "-m", f"bench_{name}", "worker"], cwd=REPO, env={**os.environ, **env}
    )
    try:
        _wait_healthy(f"http://127.0.0.1:{port}/health", worker)
        sent = _enqueue_shapes(stack, f"http://127.0.0.1:{port}/wake", secret, runs)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
    return _figures(read_starts(starts), sent)


def edge(stack: Stack, runs: list[Shape], standin: StandIn, linger: float | None) -> Figures:
    """The rendered Edge Function under `deno run`, as tests/edge/deno_worker.py starts it,
    through the PostgREST stand-in, woken by pg_net's POSTs."""
    from deno import find_deno_bin

    from tests.edge.deno_worker import FUNCTION, Deno, start_edge_worker, stop_edge_worker

    reset(stack)
    # npm packages cached once, beside the benchmark's venv (or in $DENO_DIR when it is set)
    deno = Deno(find_deno_bin(), Path(os.environ.get("DENO_DIR") or Path(sys.prefix) / "deno"))
    settings = {} if linger is None else {"PGQUEUE_LINGER_MS": str(round(linger * 1000))}
    # start_edge_worker reads only the Data API's URL from its `api`.
    api: Any = SimpleNamespace(url=standin.url)
    function_dir = stack.projects["edge"] / "supabase" / "functions" / FUNCTION
    worker = start_edge_worker(deno, function_dir, api, **settings)
    try:
        sent = _enqueue_shapes(stack, worker.url, worker.wake_secret, runs)
    finally:
        stop_edge_worker(worker)
    started = {}
    for line in worker.lines:
        if line.startswith('{"event":"bench.start"'):
            event = json.loads(line)
            started[int(event["id"])] = event["at"] / 1000
    return _figures(started, sent)


def _enqueue_shapes(
    stack: Stack, url: str, secret: str, runs: list[Shape]
) -> list[tuple[Shape, dict[int, float], dict[int, float]]]:
    """Each shape in turn, from one connection whose wake-ups go to `url`; after each, every
    wake-up must have been sent and answered 202 (at most one per enqueue: one per INSERT,
    unless one for the same queue still waited in pg_net's queue)."""
    from testkit.stack import point_wake_ups, wait_for_pg_net

    out = []
    with psycopg.connect(stack.dsn(), autocommit=True) as conn:
        conn.execute("truncate net._http_response")
        point_wake_ups(conn, url, secret)
        for shape in runs:
            sent, committed = enqueue_steadily(conn, shape.samples, shape.rate)
            wait_for_pg_net(conn, timeout=30)
            codes = dict(
                conn.execute(
                    "select status_code, count(*) from net._http_response group by 1"
                ).fetchall()
            )
            conn.execute("truncate net._http_response")
            if set(codes) != {202} or codes[202] > shape.samples:
                raise RuntimeError(
                    f"{shape.name}: wake-ups answered {codes}, expected up to {shape.samples} x 202"
                )
            out.append((shape, sent, committed))
    return out


def _figures(
    started: dict[int, float], runs: list[tuple[Shape, dict[int, float], dict[int, float]]]
) -> Figures:
    """Per shape: p50/p95/p99 from the enqueue call's start to the handler's start (issue 13's
    figures), p50/p95 from the enqueue's commit returning, and the enqueue call's own p50 (what
    the machine takes before the wake-up path even starts: more after an idle second)."""
    out: Figures = {}
    for shape, sent, committed in runs:
        figures = latency_figures(started, sent, committed)
        for figure in ("p50_ms", "p95_ms", "p99_ms", "after_commit_p50_ms", "after_commit_p95_ms"):
            out[f"{shape.name}_{figure}"] = figures[figure]
        calls = [(committed[job_id] - sent[job_id]) * 1000 for job_id in sent]
        out[f"{shape.name}_enqueue_p50_ms"] = percentile(calls, 50)
        out[f"{shape.name}_samples"] = shape.samples
    return out


def _wait_healthy(url: str, worker: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if worker.poll() is not None:
            raise RuntimeError(f"the python-http worker exited {worker.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"the python-http worker did not answer {url} in {timeout}s")


def targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target of the scenarios in `summary`: the p95 measured (median and worst of the
    runs) and whether the median meets it."""
    rows = []
    for scenario, by_shape in TARGETS_MS.items():
        for shape, target in by_shape.items():
            p95 = summary.get(scenario, {}).get(f"{shape}_p95_ms")
            if p95 is None:
                continue
            rows.append(
                {
                    "scenario": scenario,
                    "shape": shape,
                    "target_p95_ms": target,
                    "p95_ms": p95["median"],
                    "worst_p95_ms": p95["max"],
                    "met": p95["median"] <= target,
                }
            )
    return rows


def targets_table(rows: list[dict[str, Any]]) -> str:
    lines = []
    for row in rows:
        verdict = "met" if row["met"] else "NOT met"
        lines.append(
            f"target {row['scenario']} {row['shape']}: p95 {row['p95_ms']:.1f} ms "
            f"(worst run {row['worst_p95_ms']:.1f}) <= {row['target_p95_ms']} ms: {verdict}"
        )
    return "\n".join(lines)
