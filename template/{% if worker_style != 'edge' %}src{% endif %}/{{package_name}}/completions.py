# Worker machinery: you should not need to edit this file (handlers live in handlers/).
"""Successful jobs, reported to the queue in batches, most of them with the next claim.

A job's slot in the worker is free as soon as its handler returns; its success waits here
until one of two calls takes it:
- the claim loop's next claim (ride_along()): complete_and_claim() completes the jobs done so
  far and claims the next batch in one round trip and one transaction;
- run(), which sends alone (complete_many()) what no claim takes in time: at once while the
  claim loop expects no claim (the queue is empty, an outage, stopping), and otherwise what
  has waited RIDE_ALONG seconds (every slot is busy with long jobs, or a claim is slow).
  While one such call is in flight the next batch gathers.
Either way a success reaches the queue within about RIDE_ALONG seconds plus one round trip,
long before the lease of its job (no longer renewed) can end.

complete_many() answers which jobs it completed, so a job whose lease had been taken back
meanwhile is counted and logged as lost; complete_and_claim() passes over a stale token
silently, so the jobs it carries are counted done. Jobs whose claim fails go to run(), which
retries them through an outage as every report does (backoff.report()).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from .backoff import report
from .logs import job_fields, ms_since
from .queue_client import Job, QueueClient

log = logging.getLogger(__name__)

# The most jobs one call reports.
BATCH = 500
# How long a success waits for a claim to carry it before it is sent alone, in seconds.
RIDE_ALONG = 0.05


@dataclass
class _Done:
    job: Job
    started: float  # when its handler started (time.monotonic())
    added: float  # when it was handed in (time.monotonic())


class Completions:
    def __init__(self, queue: QueueClient, lease_seconds: int, counts: Counter[str]) -> None:
        self._queue = queue
        self._lease_seconds = lease_seconds
        self._counts = counts
        self._pending: list[_Done] = []
        # Set when run() may have something to send now: add(), expect_claims(), close().
        self._changed = asyncio.Event()
        self._claims_expected = True
        self._closing = False

    @property
    def pending(self) -> int:
        """How many successes wait to be reported."""
        return len(self._pending)

    def add(self, job: Job, started: float) -> None:
        """Report `job` (whose handler started at `started`, a time.monotonic() reading) done."""
        self._pending.append(_Done(job, started, time.monotonic()))
        if not self._claims_expected or len(self._pending) == 1:
            self._changed.set()

    def expect_claims(self, expected: bool) -> None:
        """Whether the claim loop will claim again soon (it is claiming, or waits for slots to
        free up). While it will not, successes are sent alone at once."""
        self._claims_expected = expected
        if not expected:
            self._changed.set()

    @contextlib.contextmanager
    def ride_along(self) -> Iterator[list[Job]]:
        """The successes waiting here (up to BATCH of them), for a claim that completes them
        (complete_and_claim): counted done when the block ends, handed back to run() to send
        alone if it raises."""
        batch, self._pending[:BATCH] = self._pending[:BATCH], []
        try:
            yield [done.job for done in batch]
        except BaseException:
            self._pending[:0] = batch
            self._changed.set()
            raise
        self._record(batch, None)

    async def run(self) -> None:
        """Send alone what no claim takes in time, until close() is called and everything
        handed in so far is reported."""
        try:
            while self._pending or not self._closing:
                due_in = self._due_in()
                if due_in is None or due_in > 0:
                    self._changed.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._changed.wait(), due_in)
                    continue
                batch, self._pending[:BATCH] = self._pending[:BATCH], []
                await self._send(batch)
        finally:
            self._closing = False  # ready for the next run()

    def close(self) -> None:
        """Let run() return once everything handed in so far is reported."""
        self._closing = True
        self._changed.set()

    def _due_in(self) -> float | None:
        """Seconds until what is pending must be sent alone; None when nothing is pending."""
        if not self._pending:
            return None
        if self._closing or not self._claims_expected:
            return 0.0
        return self._pending[0].added + RIDE_ALONG - time.monotonic()

    async def _send(self, batch: list[_Done]) -> None:
        jobs = [done.job for done in batch]
        try:
            completed = await report(
                lambda: self._queue.complete_many(jobs), give_up_after=self._lease_seconds
            )
        except Exception as exc:
            log.error(
                "job outcomes not recorded; the sweeper will retry the jobs when their leases end",
                exc_info=exc,
                extra={"event": "job.unrecorded", "job_ids": [job.id for job in jobs]},
            )
            return
        self._record(batch, set(completed or ()))

    def _record(self, batch: list[_Done], completed: set[int] | None) -> None:
        """Count and log the jobs of `batch`, reported; `completed`: the ids the queue said it
        completed, None when it does not say."""
        info = log.isEnabledFor(logging.INFO)
        for done in batch:
            ok = completed is None or done.job.id in completed
            self._counts["done" if ok else "lost"] += 1
            if info:
                log.info(
                    "job done" if ok else "job done, but its lease had been lost",
                    extra={
                        "event": "job.done",
                        "duration_ms": ms_since(done.started),
                        **job_fields(done.job),
                    },
                )
