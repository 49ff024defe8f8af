# Worker machinery: you should not need to edit this file (handlers live in handlers/).
"""The lease keeper: one loop for every job a worker has in hand.

It extends the leases of the jobs that have held theirs for half its length, all in one call
(heartbeat_many(): one renewal per claim, since a claim's jobs share a lease), stops the
handler of a job whose lease was lost (the sweeper rescued it, or it was cancelled), and stops
a handler that runs past its kind's timeout. It sleeps until the next of those is due, so a
worker holds no timer per job.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Literal

from ..queue import Job
from .context import WorkerContext
from .logs import describe_exception

log = logging.getLogger(__name__)

# Why the keeper stopped a job's handler.
StopReason = Literal["timeout", "lease_lost"]


@dataclass(slots=True)
class _Lease:
    """When a job's lease is next due for renewal and when its handler's time is up
    (time.monotonic() readings)."""

    job: Job
    renew_at: float
    deadline: float
    # When the lease runs out unless renewed: the last renewal (or the claim) + the lease.
    ends: float


class LeaseKeeper:
    def __init__(self, context: WorkerContext) -> None:
        self._context = context
        self._lease_seconds = context.lease_seconds
        self._leases: dict[asyncio.Task[None], _Lease] = {}
        self._stopped: dict[asyncio.Task[None], StopReason] = {}
        # Wakes the loop early: for a job due before the time it sleeps until, or for stop().
        self._poke = asyncio.Event()
        self._wakes_at = 0.0
        self._stopping = False

    def watch(self, task: asyncio.Task[None], job: Job, renew_at: float, deadline: float) -> None:
        """Keep the lease of the job that `task` runs, and stop `task` at `deadline`."""
        ends = renew_at + self._lease_seconds / 2  # renew_at: half a lease after the claim
        self._leases[task] = _Lease(job, renew_at, deadline, ends)
        if min(deadline, renew_at) < self._wakes_at:
            self._poke.set()

    def forget(self, task: asyncio.Task[None]) -> None:
        """`task` has ended: its job is no longer in hand."""
        self._leases.pop(task, None)
        self._stopped.pop(task, None)

    def lease_ends(self, task: asyncio.Task[Any] | None) -> float | None:
        """When the lease of the job that `task` runs ends, unless renewed (a time.monotonic()
        reading); None when `task` is not watched."""
        lease = self._leases.get(task) if task is not None else None
        return lease.ends if lease is not None else None

    def stopped_because(self, task: asyncio.Task[None]) -> StopReason | None:
        """Why the keeper cancelled `task`, or None if it did not."""
        return self._stopped.get(task)

    async def run(self) -> None:
        """Keep the leases until stop() is called."""
        try:
            while not self._stopping:
                try:
                    await self._turn()
                except Exception:
                    # Never let one bad turn end the loop: every job's lease depends on it.
                    log.exception("lease keeper failed", extra={"event": "worker.keeper_failed"})
                    await asyncio.sleep(1.0)
        finally:
            self._stopping = False  # ready for the next run()

    def stop(self) -> None:
        """Let run() return (once its current turn is over)."""
        self._stopping = True
        self._poke.set()

    async def _turn(self) -> None:
        now = time.monotonic()
        watched = [
            (task, lease)
            for task, lease in self._leases.items()
            if not (task.done() or task in self._stopped)
        ]
        due = []
        for task, lease in watched:
            if lease.deadline <= now:
                self._stop(task, "timeout")
            elif lease.renew_at <= now:
                due.append((task, lease))
        if due:
            await self._renew(due)
        times = [
            min(lease.renew_at, lease.deadline)
            for task, lease in watched
            if task not in self._stopped
        ]
        self._wakes_at = min(times, default=now + self._lease_seconds / 2)
        if self._stopping:
            return
        # Sleep until then, or until watch() or stop() pokes.
        self._poke.clear()
        delay = max(0.001, self._wakes_at - time.monotonic())
        alarm = asyncio.get_running_loop().call_later(delay, self._poke.set)
        try:
            await self._poke.wait()
        finally:
            alarm.cancel()

    async def _renew(self, due: list[tuple[asyncio.Task[None], _Lease]]) -> None:
        sent = time.monotonic()
        try:
            # WORKER_LEASE_SECONDS, or None: the database's own (the one in the context)
            running = await self._context.queue.heartbeat_many(
                [lease.job for _, lease in due], self._context.settings.lease_seconds
            )
        except Exception as exc:  # QueueUnavailable, or the queue refusing the call
            log.warning(
                "heartbeat failed, retrying",
                extra={
                    "event": "job.heartbeat_failed",
                    "job_ids": [lease.job.id for _, lease in due],
                    "error": describe_exception(exc),
                },
            )
            retry_at = time.monotonic() + min(1.0, self._lease_seconds / 4)
            for _, lease in due:
                lease.renew_at = retry_at
            return
        for task, lease in due:
            if lease.job.id in running:
                lease.renew_at = sent + self._lease_seconds / 2
                lease.ends = sent + self._lease_seconds
            elif not task.done():
                self._stop(task, "lease_lost")

    def _stop(self, task: asyncio.Task[None], reason: StopReason) -> None:
        self._stopped[task] = reason
        task.cancel()
