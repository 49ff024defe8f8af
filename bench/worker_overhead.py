"""`bench/run --worker-overhead`: the generated worker's own cost per job, with no database.

One rendered project (python worker, postgres transport) drains no-op jobs from a queue held
in memory that answers every call at once, so what is measured is the worker's Python alone:
claim rows made into jobs, a task per job, the handler's call, metrics, completions. Two
figures:
- cpu_us_per_job: the process's CPU time per job, --repeats drains of --jobs jobs. Other
  processes on the machine still move it (caches, clock), though less than they move the
  drain scenarios' figure.
- instructions_per_job: instructions executed per job, counted by valgrind's callgrind as the
  difference between a drain of --jobs jobs and one of a fifth as many (start-up and imports
  cancel out). The machine's load does not move it: the figure to compare two versions of
  the worker by. Runs about 50x slower than native.

Child side: `python -m bench.worker_overhead PACKAGE JOBS` drains JOBS jobs with the
installed package and prints its CPU seconds.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from . import generated_worker
from .generated_worker import TUNED
from .stack import REPO

# generated_worker.install() names a project's package bench_<name>
PACKAGE = "bench_overhead"
# Settings.from_env() wants a database URL; nothing connects to it.
_ENV = {
    **TUNED,
    "DATABASE_URL": "postgresql://postgres@127.0.0.1:1/postgres",
    "LOG_LEVEL": "WARNING",
    "WORKER_LEASE_SECONDS": "60",
    # the same dict and set layouts in every run, so instruction counts repeat
    "PYTHONHASHSEED": "0",
}


def run(jobs: int, repeats: int) -> dict[str, dict[str, list[float]]]:
    """{"worker_overhead": {figure: [values]}}: render and install the project, then drain."""
    from testkit.project import render, snapshot_template

    workdir = Path(tempfile.mkdtemp(prefix="pgqueue-overhead-"))
    projects = {"overhead": workdir / "project"}
    try:
        render(
            snapshot_template(workdir / "template"),
            projects["overhead"],
            project_name="Bench overhead",
            project_slug="bench-overhead",
            package_name=PACKAGE,
            worker_style="python",
            claim_transport="postgres",
        )
        # (its dependencies too: the benchmark's venv may not have them yet)
        why = generated_worker.install(projects)["overhead"]
        if why:
            raise RuntimeError(why)
        cpu = [_drain(jobs)["cpu_s"] / jobs * 1e6 for _ in range(repeats)]
        few = max(1, jobs // 5)
        instructions = (_instructions(jobs) - _instructions(few)) / (jobs - few)
    finally:
        generated_worker.uninstall(projects)
        shutil.rmtree(workdir, ignore_errors=True)
    return {"worker_overhead": {"cpu_us_per_job": cpu, "instructions_per_job": [instructions]}}


def _child(jobs: int, wrapper: list[str] | None = None) -> subprocess.CompletedProcess:
    command = [*(wrapper or []), sys.executable, "-m", "bench.worker_overhead", PACKAGE]
    return subprocess.run(
        [*command, str(jobs)],
        cwd=REPO,
        env={**os.environ, **_ENV},
        capture_output=True,
        text=True,
        check=True,
    )


def _drain(jobs: int) -> dict[str, float]:
    return json.loads(_child(jobs).stdout)


def _instructions(jobs: int) -> int:
    """Instructions a child drain of `jobs` executes, start-up included."""
    if shutil.which("valgrind") is None:
        raise RuntimeError("valgrind is not installed: run scripts/setup")
    callgrind = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    stderr = _child(jobs, callgrind).stderr
    found = re.search(r"Collected : (\d+)", stderr)
    if found is None:
        raise RuntimeError(f"callgrind printed no instruction count: {stderr[-2000:]}")
    return int(found.group(1))


# Child side: one drain.


class InMemoryQueue:
    """The calls a draining worker makes, answered at once. Claims return rows shaped as
    the postgres transport gets them (tuples, the payload and the lock token as text)
    and make them jobs as it does; each call yields to the event loop once, as a round trip
    would."""

    def __init__(self, job_class: Any, jobs: int) -> None:
        self._job_class = job_class
        self._left = jobs
        self._next_id = 1
        self.completed = 0

    async def configure(self, changes: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"lease_seconds": 60, "max_result_bytes": 65536}

    async def checkin(self, worker: str, queue: str, kinds: list[str]) -> None:
        await asyncio.sleep(0)

    async def complete_and_claim(
        self,
        worker: str,
        done: list[Any],
        max_jobs: int,
        *,
        kinds: list[str],
        queue: str,
        lease_seconds: int,
    ) -> list[Any]:
        await asyncio.sleep(0)
        self.completed += len(done)
        count = min(max_jobs, self._left)
        self._left -= count
        token = str(uuid.uuid4())  # one a claim, as text as the transports read it
        rows = [
            (job_id, "noop", f'{{"n": {job_id}}}', 1, 5, token)
            for job_id in range(self._next_id, self._next_id + count)
        ]
        self._next_id += count
        return [self._job_class.claimed(queue, *row) for row in rows]

    async def complete_many(self, jobs: list[Any]) -> list[int]:
        await asyncio.sleep(0)
        self.completed += len(jobs)
        return [job.id for job in jobs]

    async def heartbeat_many(self, jobs: list[Any], lease_seconds: int) -> set[int]:
        return {job.id for job in jobs}

    async def wait_for_jobs(self, queue: str, timeout: float) -> bool:
        await asyncio.sleep(timeout)
        return False

    async def close(self) -> None:
        pass


async def _drain_child(package: str, jobs: int) -> dict[str, float]:
    queue_client = generated_worker.module(package, "queue.client", "queue_client")
    registry = importlib.import_module(f"{package}.registry")
    settings = importlib.import_module(f"{package}.settings").Settings.from_env()
    worker_module = importlib.import_module(f"{package}.worker")
    generated_worker.module(package, "worker.logs", "logs").configure("WARNING")
    queue = InMemoryQueue(queue_client.Job, jobs)
    worker = worker_module.Worker(queue, settings, registry.load_handlers())
    cpu = time.process_time()
    await worker.drain()
    cpu = time.process_time() - cpu
    if queue.completed != jobs or worker.counts["done"] != jobs:
        raise RuntimeError(f"completed {queue.completed} of {jobs} jobs")
    return {"cpu_s": cpu}


if __name__ == "__main__":
    drained = _drain_child(sys.argv[1], int(sys.argv[2]))
    print(json.dumps(generated_worker.run_on_worker_loop(sys.argv[1], drained)))
