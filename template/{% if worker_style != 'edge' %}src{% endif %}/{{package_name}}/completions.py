# Worker machinery: you should not need to edit this file (handlers live in handlers/).
"""Successful jobs reported in batches: one complete_many() call for many jobs.

While one call is in flight the next batch gathers, so a busy worker completes many jobs per
round trip. A job's slot in the worker is free as soon as its handler returns; its outcome
(done, or lost if its lease had been taken back) is counted and logged once the queue has
answered.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

from .backoff import report
from .logs import job_fields, ms_since
from .queue_client import Job, QueueClient

log = logging.getLogger(__name__)

# The most jobs one complete_many() call reports.
BATCH = 500


class Completions:
    def __init__(self, queue: QueueClient, lease_seconds: int, counts: Counter[str]) -> None:
        self._queue = queue
        self._lease_seconds = lease_seconds
        self._counts = counts
        self._pending: list[tuple[Job, float]] = []
        self._arrived = asyncio.Event()
        self._closing = False

    def add(self, job: Job, started: float) -> None:
        """Report `job` (whose handler started at `started`, a time.monotonic() reading) done."""
        self._pending.append((job, started))
        self._arrived.set()

    async def run(self) -> None:
        """Report what add() hands in until close() is called and all of it is reported."""
        try:
            while True:
                await self._arrived.wait()
                self._arrived.clear()
                while self._pending:
                    batch = self._pending[:BATCH]
                    del self._pending[:BATCH]
                    await self._report(batch)
                if self._closing:
                    return
        finally:
            self._closing = False  # ready for the next run()

    def close(self) -> None:
        """Let run() return once everything handed in so far is reported."""
        self._closing = True
        self._arrived.set()

    async def _report(self, batch: list[tuple[Job, float]]) -> None:
        jobs = [job for job, _ in batch]
        try:
            done = await report(
                lambda: self._queue.complete_many(jobs), give_up_after=self._lease_seconds
            )
        except Exception as exc:
            log.error(
                "job outcomes not recorded; the sweeper will retry the jobs when their leases end",
                exc_info=exc,
                extra={"event": "job.unrecorded", "job_ids": [job.id for job in jobs]},
            )
            return
        completed = set(done or ())
        info = log.isEnabledFor(logging.INFO)
        for job, started in batch:
            ok = job.id in completed
            self._counts["done" if ok else "lost"] += 1
            if info:
                log.info(
                    "job done" if ok else "job done, but its lease had been lost",
                    extra={
                        "event": "job.done",
                        "duration_ms": ms_since(started),
                        **job_fields(job),
                    },
                )
