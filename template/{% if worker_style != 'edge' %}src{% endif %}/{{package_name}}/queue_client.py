# Worker machinery: you should not need to edit this file (handlers live in handlers/).
"""The queue client: one interface over the queue's SQL functions, whatever the transport.

Every method is one call to a function in the queue's schema (settings.QUEUE_SCHEMA; see
supabase/migrations); no queue logic lives in Python. The transport module this project was
generated with implements it, and its `open_queue(settings)` returns one.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol
from uuid import UUID

from pydantic import BaseModel


class QueueUnavailable(Exception):
    """The database or the Data API cannot be reached right now; retry with backoff."""


class ConfigRefused(ValueError):
    """The database refused a configuration change; the message says which setting and why."""


class Job(BaseModel):
    """A claimed job: what a worker needs to run it and to report back with its lock token."""

    id: int
    queue: str
    kind: str
    # Whatever JSON was enqueued; the handler's model decides whether it is valid.
    payload: Any
    # Set (and payload None) when the transport could not decode the payload, e.g. JSON
    # nested deeper than Python's json module goes: the worker fails the job with it.
    payload_error: str | None = None
    attempts: int
    max_attempts: int
    lock_token: UUID

    @classmethod
    def from_claim(cls, row: dict[str, Any], queue: str) -> Job:
        """A row of complete_and_claim(), which names no queue (its jobs are of the `queue`
        it was asked for), whose payload came as JSON text (`payload::text`): the payload is
        decoded here, job by job, so one payload Python cannot decode fails its own job
        instead of the claim of the whole batch."""
        try:
            payload, error = json.loads(row["payload"]), None
        except RecursionError:
            payload, error = None, _TOO_DEEP
        return cls.model_validate(
            row | {"queue": queue, "payload": payload, "payload_error": error}
        )


_TOO_DEEP = "nested too deeply to decode (Python's json stops near 1,000 levels)"


class NewJob(BaseModel):
    """One job for enqueue_many(); unset fields take the queue's defaults."""

    kind: str
    payload: dict[str, Any] = {}
    run_after: datetime | None = None
    idempotency_key: str | None = None
    queue: str | None = None
    priority: int | None = None
    max_attempts: int | None = None


FailStatus = Literal["queued", "failed"]


class QueueClient(Protocol):
    """What the worker, the CLI and the HTTP app need from the queue."""

    async def enqueue(
        self,
        kind: str,
        payload: dict[str, Any] | None = None,
        *,
        queue: str = "default",
        run_after: datetime | None = None,
        idempotency_key: str | None = None,
        priority: int = 0,
        max_attempts: int | None = None,
    ) -> int:
        """Enqueue one job and return its id (the existing job's id for a taken key)."""
        ...

    async def enqueue_many(self, jobs: list[NewJob]) -> list[int]:
        """Enqueue many jobs in one statement; ids in input order."""
        ...

    async def complete_and_claim(
        self,
        worker: str,
        done: list[Job],
        max_jobs: int,
        *,
        kinds: list[str],
        queue: str,
        lease_seconds: int,
    ) -> list[Job]:
        """Mark the `done` jobs done (passing over any whose token is stale, silently) and
        lease up to max_jobs runnable jobs of these kinds on a queue to `worker`, in one call
        and one transaction; jobs of other kinds stay queued for the workers that handle
        them. max_jobs 0 only completes."""
        ...

    async def complete(self, job: Job) -> bool:
        """Mark one job done; False when its token is stale (the job was rescued or finished)."""
        ...

    async def complete_many(self, jobs: list[Job]) -> list[int]:
        """Mark jobs done; returns the ids whose token was still valid."""
        ...

    async def fail(
        self,
        job: Job,
        error: str,
        *,
        retryable: bool = True,
        retry_in: timedelta | None = None,
    ) -> FailStatus | None:
        """Record a failed attempt: 'queued' (retried later), 'failed' (dead letter), or None
        when the token is stale."""
        ...

    async def heartbeat(self, job: Job, lease_seconds: int) -> bool:
        """Extend a job's lease; False means another attempt owns the job now."""
        ...

    async def release(self, job: Job) -> bool:
        """Give a claimed job back to the queue without counting the attempt."""
        ...

    async def retry(self, job_id: int) -> bool:
        """Queue a dead-lettered or cancelled job again with fresh attempts."""
        ...

    async def cancel(self, job_id: int) -> bool:
        """Cancel a queued or running job; False when it had already finished."""
        ...

    async def stats(self) -> list[dict[str, Any]]:
        """Rows of the `stats` view: jobs per queue, kind and status."""
        ...

    async def dead_letters(self, limit: int = 50) -> list[dict[str, Any]]:
        """Rows of the `dead_letters` view, newest first."""
        ...

    async def checkin(self, worker: str, queue: str, kinds: list[str]) -> None:
        """Tell the database that `worker` claims `kinds` from `queue` (see `unclaimed`)."""
        ...

    async def unclaimed(self) -> list[dict[str, Any]]:
        """Rows of the `unclaimed` view: queued jobs per queue and kind that no worker seen in
        the last 10 minutes claims."""
        ...

    async def health(self) -> list[dict[str, Any]]:
        """Rows of `health()`: component, ok, detail -- what wake-ups and rescues depend on
        (pg_net, the worker URL, the key, recent pg_net failures, the sweeper)."""
        ...

    async def configure(self, changes: dict[str, Any] | None = None) -> dict[str, Any]:
        """The queue's run-time configuration (defaults for attempts, lease, retention, the
        wake-up URL and the sweeper's schedule), after applying `changes`."""
        ...

    async def wait_for_jobs(self, queue: str, timeout: float) -> None:
        """Return when jobs may have arrived on `queue`, or after `timeout` seconds."""
        ...

    async def close(self) -> None: ...
