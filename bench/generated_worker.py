"""Scenarios that run the generated project's own worker: its settings, transport, handler
registry (the job kind is a handler module dropped into handlers/, as a user adds one), lock
tokens and batched completions.

Parent side: `install`, `drain`, `latency`. Child side (one process per worker):
`python -m bench.generated_worker drain|run PACKAGE`, configured by the environment
variables the generated worker reads (DATABASE_URL or SUPABASE_URL + SERVICE_ROLE_KEY,
WORKER_CONCURRENCY, WORKER_BATCH_SIZE, LOG_LEVEL).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Coroutine
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import psycopg

from .queue_sql import live_job_count, percentile, reset
from .stack import REPO, SCHEMA, Stack, pip_install_editable

T = TypeVar("T")

# The job kind: a handler module added to each rendered project's handlers/, as a user adds one.
NOOP_HANDLER = Path(__file__).parent / "handlers" / "bench_noop.py"

# What the drain figures run with: big batches, many jobs in flight (the defaults, 10 and
# 10, suit slow handlers; a no-op handler shows the machinery's own ceiling).
TUNED = {"WORKER_CONCURRENCY": "500", "WORKER_BATCH_SIZE": "250"}


def install(projects: dict[str, Path]) -> dict[str, str | None]:
    """Add the no-op handler module to each rendered project (transport -> project) and
    `pip install -e` them into this venv, in one pip run. Returns, per transport, None when
    its worker is ready for the scenarios, else what is wrong."""
    why: dict[str, str | None] = {}
    for name, project in projects.items():
        handlers = project / "src" / f"bench_{name}" / "handlers"
        if handlers.is_dir():
            shutil.copy(NOOP_HANDLER, handlers / NOOP_HANDLER.name)
            why[name] = None
        else:
            why[name] = f"the rendered project has no {handlers.relative_to(project)}"
    ready = [projects[name] for name, reason in why.items() if reason is None]
    try:
        pip_install_editable(*ready)
    except subprocess.CalledProcessError as exc:
        failed = f"pip install -e failed: {exc.stderr.decode()[-2000:]}"
        return {name: reason or failed for name, reason in why.items()}
    for name, reason in why.items():
        if reason is None:
            why[name] = _check(f"bench_{name}")
    return why


def _check(package: str) -> str | None:
    check = (
        "import importlib\n"
        "from bench.generated_worker import transport_module\n"
        f"worker = importlib.import_module('{package}.worker')\n"
        f"registry = importlib.import_module('{package}.registry')\n"
        f"transport_module('{package}').open_queue\n"
        "assert hasattr(worker.Worker, 'drain'), 'the generated Worker has no drain()'\n"
        "assert 'noop' in registry.load_handlers().kinds(), 'noop did not register'\n"
    )
    proc = subprocess.run([sys.executable, "-c", check], cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        return f"the generated worker is not usable: {proc.stderr.strip()[-2000:]}"
    return None


def uninstall(projects: dict[str, Path]) -> None:
    """Take the editable installs out of the venv again (their folders are temporary)."""
    names = [path.name for path in projects.values()]
    subprocess.run(
        [sys.executable, "-m", "pip", "uninstall", "-q", "-y", *names], capture_output=True
    )


class StandIn:
    """The PostgREST stand-in over the benchmark's cluster, in a process of its own (so it
    does not share a GIL with the benchmark); it stops when its stdin closes (so, with the
    benchmark). `url` and `key` (a service_role JWT) are what a worker is given."""

    def __init__(self, stack: Stack) -> None:
        code = (
            "import sys\n"
            "from testkit.postgrest import PostgRESTStandIn, make_jwt\n"
            f"s = PostgRESTStandIn({stack.dsn()!r}, schemas=({SCHEMA!r},), pool_size=8)\n"
            "s.start()\n"
            "print(s.url, make_jwt('service_role'), flush=True)\n"
            "sys.stdin.read()\n"
            "s.stop()\n"
        )
        self._process = subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        started = self._process.stdout.readline().split()
        if len(started) != 2:
            self.close()
            raise RuntimeError("the PostgREST stand-in did not start (see stderr above)")
        self.url, self.key = started

    def close(self) -> None:
        self._process.stdin.close()
        try:
            self._process.wait(15)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


class Transport:
    """Where the generated worker finds the queue: the environment it is started with."""

    def __init__(self, stack: Stack, name: str) -> None:
        self.name = name
        self.package = f"bench_{name}"
        self.env = {"LOG_LEVEL": "WARNING", "WORKER_POLL_INTERVAL": "1"}
        self._standin: StandIn | None = None
        if name == "postgres":
            self.env["DATABASE_URL"] = stack.dsn()
        else:
            self._standin = StandIn(stack)
            self.env["SUPABASE_URL"] = self._standin.url
            self.env["SERVICE_ROLE_KEY"] = self._standin.key

    def close(self) -> None:
        if self._standin is not None:
            self._standin.close()


def _spawn(
    transport: Transport, mode: str, extra_env: dict[str, str], profile: Path | None = None
) -> subprocess.Popen[str]:
    profiler = []
    if profile is not None:
        profiler = ["-m", "pyinstrument", "-r", "text", "--no-color", "-o", str(profile)]
    return subprocess.Popen(
        [sys.executable, *profiler, "-m", "bench.generated_worker", mode, transport.package],
        cwd=REPO,
        env={**os.environ, **transport.env, **extra_env},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def drain(
    stack: Stack,
    transport: Transport,
    jobs: int,
    processes: int,
    env: dict[str, str] = TUNED,
    profile: Path | None = None,
) -> dict[str, float]:
    """`processes` worker processes drain `jobs` pre-enqueued no-op jobs; jobs/s from the go
    signal to the last process's last completion, and the worker processes' CPU time per job
    (user + system, their own: a figure the load of the machine barely moves). With `profile`,
    the (single) worker runs under pyinstrument, which writes its report there."""
    reset(stack, queued=jobs)  # (as enqueue_many() stores them)
    workers = [_spawn(transport, "drain", env, profile) for _ in range(processes)]
    try:
        for proc in workers:
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError(f"a {transport.name} worker did not start")
        started = time.perf_counter()
        for proc in workers:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results = [json.loads(proc.stdout.readline()) for proc in workers]
    finally:
        for proc in workers:
            proc.stdin.close()
            if proc.wait(60) != 0:
                raise RuntimeError(f"a {transport.name} worker exited {proc.returncode}")
    done = sum(r["done"] for r in results)
    with stack.cluster.connect() as conn:
        left = live_job_count(conn)
    if done != jobs or left:
        raise RuntimeError(f"{transport.name} workers completed {done} of {jobs}; {left} left")
    return {
        "jobs_per_s": jobs / (max(r["finished_at"] for r in results) - started),
        "cpu_us_per_job": sum(r["cpu_s"] for r in results) / jobs * 1e6,
    }


def latency(stack: Stack, transport: Transport, samples: int, rate: float) -> dict[str, float]:
    """One worker running as it does in production (`run()`, default settings); jobs are
    enqueued one at a time at `rate` jobs/s. Latency: from the start of the enqueue call (its
    commit included) to the handler's start, per job."""
    reset(stack)
    starts = Path(tempfile.mkstemp(prefix="bench-starts-")[1])
    worker = _spawn(transport, "run", {"BENCH_HANDLER_STARTS": str(starts)})
    try:
        if worker.stdout.readline().strip() != "ready":
            raise RuntimeError(f"a {transport.name} worker did not start")
        worker.stdin.write("go\n")
        worker.stdin.flush()
        with psycopg.connect(stack.dsn(), autocommit=True) as conn:
            time.sleep(0.5)  # the worker is idle and waiting
            sent, committed = enqueue_steadily(conn, samples, rate)
    finally:
        worker.stdin.close()  # stop
        worker.wait(60)
    return latency_figures(read_starts(starts), sent, committed)


def enqueue_steadily(
    conn: psycopg.Connection, samples: int, rate: float
) -> tuple[dict[int, float], dict[int, float]]:
    """Enqueue `samples` no-op jobs one at a time (each its own statement and commit) at
    `rate` jobs/s, then wait until they are done. Returns, per job, when its enqueue call
    started and when its commit returned."""
    sent: dict[int, float] = {}
    committed: dict[int, float] = {}
    enqueue = f"select {SCHEMA}.enqueue('noop')"
    next_at = time.perf_counter()
    for _ in range(samples):
        while (now := time.perf_counter()) < next_at:
            time.sleep(min(0.001, next_at - now))
        at = time.time()
        job_id = conn.execute(enqueue, prepare=True).fetchone()[0]
        sent[job_id], committed[job_id] = at, time.time()
        next_at += 1 / rate
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done = conn.execute(
            f"select count(*) from {SCHEMA}.all_jobs where id = any(%s) and status = 'done'",
            (list(sent),),
        )
        if done.fetchone()[0] >= samples:
            break
        time.sleep(0.1)
    return sent, committed


def read_starts(starts: Path) -> dict[int, float]:
    """The handler's start times (job id -> Unix time) as it logged them in `starts`, which
    is removed."""
    started = {}
    for line in starts.read_text().splitlines():
        job_id, at = line.split()
        started[int(job_id)] = float(at)
    starts.unlink()
    return started


def latency_figures(
    started: dict[int, float], sent: dict[int, float], committed: dict[int, float]
) -> dict[str, float]:
    """p50/p95/p99 from each enqueue call's start (and p50/p95 from its commit returning) to
    its handler's start."""
    missing = [job_id for job_id in sent if job_id not in started]
    if missing:
        raise RuntimeError(f"the worker started {len(sent) - len(missing)} of {len(sent)} jobs")
    latency = [(started[i] - sent[i]) * 1000 for i in sent]
    after_commit = [(started[i] - committed[i]) * 1000 for i in sent]
    return {
        "p50_ms": percentile(latency, 50),
        "p95_ms": percentile(latency, 95),
        "p99_ms": percentile(latency, 99),
        "after_commit_p50_ms": percentile(after_commit, 50),
        "after_commit_p95_ms": percentile(after_commit, 95),
    }


# Child side: one worker process.


def module(package: str, *names: str) -> ModuleType:
    """The first of `names` (modules of the generated package, newest layout first) that
    `package` has: projects generated since 1.3.0 keep the queue client in queue/ and the
    worker's machinery in worker/; older ones had every module at the package's top."""
    for name in names:
        try:
            found = importlib.util.find_spec(f"{package}.{name}")
        except ModuleNotFoundError:  # its parent is a module, not a package
            found = None
        if found is not None:
            return importlib.import_module(f"{package}.{name}")
    raise RuntimeError(f"{package} has none of the modules {', '.join(names)}")


def transport_module(package: str) -> ModuleType:
    """The generated package's transport module (postgres_transport or supabase_transport),
    whose open_queue() connects to the queue."""
    return module(
        package,
        "queue.postgres_transport",
        "queue.supabase_transport",
        "postgres_transport",
        "supabase_transport",
    )


def run_on_worker_loop(package: str, main: Coroutine[Any, Any, T]) -> T:
    """Run `main` on the event loop the generated worker's own command runs on (uvloop where
    installed): `package`'s run_until_complete, in worker/event_loop.py (event_loop.py before
    1.3.0, worker.py in projects generated before it had a module of its own)."""
    home = module(package, "worker.event_loop", "event_loop", "worker")
    result: T = home.run_until_complete(main)
    return result


async def _child(mode: str, package: str) -> None:
    transport = transport_module(package)
    registry = importlib.import_module(f"{package}.registry")
    settings_module = importlib.import_module(f"{package}.settings")
    worker_module = importlib.import_module(f"{package}.worker")
    module(package, "worker.logs", "logs").configure(os.environ.get("LOG_LEVEL", "WARNING"))

    settings = settings_module.Settings.from_env()
    queue = await transport.open_queue(settings)
    worker = worker_module.Worker(queue, settings, registry.load_handlers())
    loop = asyncio.get_running_loop()
    print("ready", flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)  # go
    try:
        if mode == "drain":
            cpu = time.process_time()
            await worker.drain()
            finished = {
                "done": worker.counts["done"],
                "finished_at": time.perf_counter(),
                "cpu_s": time.process_time() - cpu,
            }
            print(json.dumps(finished), flush=True)
        else:
            running = asyncio.create_task(worker.run())
            await loop.run_in_executor(None, sys.stdin.readline)  # EOF: stop
            worker.stop()
            await running
    finally:
        await queue.close()


if __name__ == "__main__":
    run_on_worker_loop(sys.argv[2], _child(sys.argv[1], sys.argv[2]))
