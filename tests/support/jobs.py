"""Jobs as the tests see them: enqueue one, read its row, read what the probe handler logged,
and wait for a condition."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from testkit.cluster import Cluster


def enqueue(
    db: psycopg.Connection,
    kind: str = "e2e_probe",
    max_attempts: int | None = None,
    concurrency_key: str | None = None,
    **payload: object,
) -> int:
    """pgqueue.enqueue() of one job; the probe handler's kind unless another is named."""
    row = db.execute(
        "select pgqueue.enqueue(%s, %s, max_attempts => %s, concurrency_key => %s)",
        (kind, Jsonb(payload), max_attempts, concurrency_key),
    ).fetchone()
    assert row is not None
    return row[0]


def job(db: psycopg.Connection, job_id: int) -> dict:
    """The job's row, and `due_in`: how long until it may run (negative once it may)."""
    with db.cursor(row_factory=dict_row) as cur:
        row = cur.execute(
            "select *, run_after - now() as due_in from pgqueue.all_jobs where id = %s", (job_id,)
        ).fetchone()
    assert row is not None, f"job {job_id} is gone"
    return row


def job_by_id(db: psycopg.Connection, job_id: int) -> dict:
    """pgqueue.job(id): the job, live or finished, with its progress and result."""
    with db.cursor(row_factory=dict_row) as cur:
        row = cur.execute("select * from pgqueue.job(%s)", (job_id,)).fetchone()
    assert row is not None, f"job({job_id}) found nothing"
    return row


def probe_lines(log: Path) -> list[dict]:
    """Each line the probe handler wrote: job_id, attempt, at ("start", "progress" or "end"),
    t (its time.time()), and what else it recorded."""
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def runs(log: Path, job_id: int) -> list[tuple[int, str]]:
    """(attempt, "start"|"end") for each start and end the probe handler wrote for a job."""
    return [
        (line["attempt"], line["at"])
        for line in probe_lines(log)
        if line["job_id"] == job_id and line["at"] != "progress"
    ]


def wait_until(
    condition: Callable[[], Any],
    timeout: float = 20,
    what: str = "condition",
    tick: Callable[[], object] | None = None,
    interval: float = 0.05,
) -> Any:
    """Poll `condition` until it returns something truthy; `tick` runs between polls."""
    deadline = time.monotonic() + timeout
    while True:
        if result := condition():
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        if tick is not None:
            tick()
        time.sleep(interval)


@contextmanager
def running_of_key(cluster: Cluster, key: str, every: float = 0.005) -> Iterator[list[int]]:
    """For as long as the block runs, count from a connection of its own how many jobs of
    concurrency key `key` are running, every `every` seconds (0: back to back). Yields the
    list the counts go into."""
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        with cluster.connect(autocommit=True) as conn:
            while not stop.is_set():
                (running,) = conn.execute(
                    "select count(*) from pgqueue.live_jobs"
                    " where concurrency_key = %s and status = 'running'",
                    (key,),
                ).fetchone()
                samples.append(running)
                if every:
                    time.sleep(every)

    sampler = threading.Thread(target=sample, name=f"running jobs of {key}")
    sampler.start()
    try:
        yield samples
    finally:
        stop.set()
        sampler.join()
