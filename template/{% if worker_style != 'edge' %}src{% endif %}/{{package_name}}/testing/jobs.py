# Test helper machinery: you should not need to edit this file (handlers live in handlers/).
"""Against the test database: the jobs a test enqueued, and a queue drained through the
project's own handlers, in-process (fixtures.py wraps both for pytest).

Both read the queue through the project's own client (queue/), whichever transport it uses:
enqueued jobs from the `live_jobs` view, and what each drained job ended as from `job(id)`.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel

from ..queue import FailStatus, Job, QueueClient, open_queue
from ..queue.functions import Filter
from ..registry import Registry, load_handlers
from ..settings import Settings
from ..worker import Worker


class EnqueuedJob(BaseModel):
    """A queued (or running) job, as the `live_jobs` view shows it."""

    id: int
    queue: str
    kind: str
    payload: Any
    status: str
    priority: int | None
    attempts: int
    max_attempts: int | None
    run_after: datetime
    idempotency_key: str | None
    concurrency_key: str | None

    def __str__(self) -> str:
        payload = json.dumps(self.payload, sort_keys=True, default=str)
        return (
            f"#{self.id} {self.kind} on {self.queue!r}, {self.status}, run_after "
            f"{self.run_after.isoformat(timespec='seconds')}: {payload}"
        )


async def live_jobs(queue: QueueClient, on_queue: str | None = None) -> list[EnqueuedJob]:
    """The queued and running jobs (of `on_queue`, or every queue), oldest first."""
    where: list[Filter] = [] if on_queue is None else [("queue", "eq", on_queue)]
    rows = await queue.read("live_jobs", columns=_LIVE_COLUMNS, order=["id"], where=where)
    return [EnqueuedJob.model_validate(row) for row in rows]


_LIVE_COLUMNS = tuple(EnqueuedJob.model_fields)


@dataclass(frozen=True)
class JobFilter:
    """What assert_enqueued() looks for: every given field must match (the payload: these
    keys with these values, others allowed; run_after: within `tolerance`)."""

    kind: str
    payload: dict[str, Any] | None = None
    queue: str | None = None
    run_after: datetime | None = None
    tolerance: timedelta = timedelta(seconds=1)

    def matches(self, job: EnqueuedJob) -> bool:
        payload = job.payload if isinstance(job.payload, dict) else {}
        return (
            job.kind == self.kind
            and (self.queue is None or job.queue == self.queue)
            and all(k in payload and payload[k] == v for k, v in (self.payload or {}).items())
            and (self.run_after is None or abs(job.run_after - self.run_after) <= self.tolerance)
        )

    def __str__(self) -> str:
        wanted = [f"kind {self.kind!r}"]
        if self.payload is not None:
            wanted.append(f"a payload holding {json.dumps(self.payload, sort_keys=True)}")
        if self.queue is not None:
            wanted.append(f"queue {self.queue!r}")
        if self.run_after is not None:
            wanted.append(f"run_after {self.run_after.isoformat()} (± {self.tolerance})")
        return ", ".join(wanted)


def not_found(wanted: JobFilter, enqueued: list[EnqueuedJob]) -> str:
    """The failure message of an assert_enqueued() that found nothing: what it looked for,
    and every job enqueued in the test."""
    listed = "\n".join(f"  {job}" for job in enqueued) or "  none"
    return f"no job enqueued with {wanted}; the jobs enqueued in this test:\n{listed}"


# What a drained job ended as: done (its result kept), failed (an attempt failed and the job
# waits for its next one), snoozed (its handler raised Snooze: it waits, its attempt not
# counted), dead (dead-lettered), cancelled, queued (not run: not due yet), running (still
# running when the drain gave up).
Outcome = Literal["done", "failed", "snoozed", "dead", "cancelled", "queued", "running"]


@dataclass(frozen=True)
class Ended:
    """What one job of a drained queue ended as."""

    id: int
    kind: str
    outcome: Outcome
    attempts: int
    result: Any = None
    error: str | None = None
    run_after: datetime | None = None


def _outcome(status: str, attempts: int, error: str | None, snoozed: bool) -> Outcome:
    if status == "queued" and snoozed:
        return "snoozed"
    if status == "queued":
        return "failed" if attempts > 0 and error is not None else "queued"
    statuses: dict[str, Outcome] = {
        "done": "done",
        "failed": "dead",
        "cancelled": "cancelled",
        "running": "running",
    }
    return statuses[status]


async def drain(
    settings: Settings, registry: Registry | None = None, timeout: float = 60.0
) -> list[Ended]:
    """Run the due jobs of settings.queue (and the jobs they enqueue there) through
    `registry`'s handlers (default: handlers/) until none is due; what each ended as, by id.
    A drain still going after `timeout` seconds is stopped (its running jobs released) and
    fails the test, naming them."""
    queue = await open_queue(settings)
    try:
        on_queue: list[Filter] = [("queue", "eq", settings.queue)]
        before = await queue.read("all_jobs", columns=["id"], where=on_queue)
        seen = max((row["id"] for row in before), default=0)
        waiting = {job.id for job in await live_jobs(queue, settings.queue)}
        snoozed = _recording_snoozes(queue)
        worker = Worker(queue, settings, registry if registry is not None else load_handlers())
        draining = asyncio.create_task(worker.drain())
        done, _ = await asyncio.wait([draining], timeout=timeout)
        stuck = [] if done else await live_jobs(queue, settings.queue)
        if not done:
            worker.stop()
            await draining
            running = "\n".join(f"  {job}" for job in stuck if job.status == "running")
            raise AssertionError(
                f"the drain of queue {settings.queue!r} did not end within {timeout:g}s; "
                f"running then:\n{running or '  none'}"
            )
        await draining
        after = await queue.read("all_jobs", columns=["id"], where=[*on_queue, ("id", "gt", seen)])
        ids = sorted(waiting | {row["id"] for row in after})
        return [await _ended(queue, job_id, job_id in snoozed) for job_id in ids]
    finally:
        await queue.close()


def _recording_snoozes(queue: QueueClient) -> set[int]:
    """The ids of the jobs `queue`'s snooze() hands back to wait, from now on."""
    snoozed: set[int] = set()
    snooze = queue.snooze

    async def recorded(job: Job, delay: timedelta, max_snoozes: int) -> FailStatus | None:
        status = await snooze(job, delay, max_snoozes)
        if status == "queued":
            snoozed.add(job.id)
        return status

    queue.snooze = recorded  # type: ignore[method-assign]
    return snoozed


async def _ended(queue: QueueClient, job_id: int, snoozed: bool) -> Ended:
    state = await queue.job(job_id)
    if state is None:
        raise AssertionError(f"job {job_id} is gone (pruned?) before its outcome was read")
    return Ended(
        state.id,
        state.kind,
        _outcome(state.status, state.attempts, state.last_error, snoozed),
        state.attempts,
        state.result,
        state.last_error,
        state.run_after,
    )
