# Queue client machinery: you should not need to edit this file (handlers live in handlers/).
"""The queue client: one interface over the queue's SQL functions, whatever the transport.

Every method is one call to a function in the queue's schema (settings.QUEUE_SCHEMA; see
supabase/migrations); no queue logic lives in Python. A transport implements the worker's hot
path below (claims, completions, failures, leases, wake-ups) in the way that suits it, and the
two calls every other method is written on once (functions.py). The transport module this
project was generated with implements it, and its `open_queue(settings)` returns one.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NewType

from pydantic_core import from_json

from .errors import (
    ConfigRefused,
    QueueApiError,
    QueueUnavailable,
    Refused,
    SchemaMissing,
    TooLarge,
)
from .functions import QueueFunctions
from .types import (
    ON_CONFLICT,
    FailStatus,
    JobState,
    Metric,
    NewJob,
    OnConflict,
    QueueState,
    Schedule,
    ThroughputPoint,
)

# The names the rest of the project (and your code) imports from here.
__all__ = [
    "ON_CONFLICT",
    "ConfigRefused",
    "Done",
    "FailStatus",
    "Job",
    "JobState",
    "JsonText",
    "Metric",
    "NewJob",
    "OnConflict",
    "QueueApiError",
    "QueueClient",
    "QueueState",
    "QueueUnavailable",
    "Refused",
    "Schedule",
    "SchemaMissing",
    "ThroughputPoint",
    "TooLarge",
]


@dataclass(slots=True)
class Job:
    """A claimed job: what a worker needs to run it and to report back with its lock token.

    A plain class, not a pydantic model: its rows come from the queue's own SQL function, whose
    types are fixed, and validating each of them cost more than the rest of the claim."""

    id: int
    queue: str
    kind: str
    # Whatever JSON was enqueued; the handler's model decides whether it is valid.
    payload: Any
    attempts: int
    max_attempts: int
    # Its claim's lock token, as text: sent back as it came, it is never parsed in Python.
    lock_token: str
    # Set (and payload None) when the transport could not decode the payload, e.g. JSON
    # nested deeper than Python's json module goes: the worker fails the job with it.
    payload_error: str | None = None

    @classmethod
    def from_claim(cls, row: dict[str, Any], queue: str) -> Job:
        """A row of complete_and_claim() as a dict (the Data API's JSON): see claimed()."""
        return cls.claimed(
            queue,
            row["id"],
            row["kind"],
            row["payload"],
            row["attempts"],
            row["max_attempts"],
            row["lock_token"],
        )

    @classmethod
    def claimed(
        cls,
        queue: str,
        job_id: int,
        kind: str,
        text: str,
        attempts: int,
        max_attempts: int,
        token: str,
    ) -> Job:
        """A row of complete_and_claim(), which names no queue (its jobs are of the `queue`
        it was asked for), whose payload came as JSON text (`payload::text`): the payload is
        decoded here, job by job, so one payload Python cannot decode fails its own job
        instead of the claim of the whole batch. The lock token comes as text from both
        transports (the postgres transport selects `lock_token::text`)."""
        try:
            # pydantic's JSON reader, in Rust: several times faster than the json module
            payload, error = from_json(text), None
        except ValueError:
            # It stops at a few hundred levels of nesting; the json module reads more.
            try:
                payload, error = json.loads(text), None
            except RecursionError:
                payload, error = None, _TOO_DEEP
        return cls(
            job_id,
            queue,
            kind,
            payload,
            attempts,
            max_attempts,
            token,
            error,
        )


_TOO_DEEP = "nested too deeply to decode (Python's json stops near 1,000 levels)"

# A JSON document as compact text: how results and progress travel to the queue (results.py
# makes it from a handler's value, and checks its size).
JsonText = NewType("JsonText", str)


@dataclass(slots=True)
class Done:
    """A job whose handler returned, and its result (None: the handler returned none)."""

    job: Job
    result: JsonText | None


class QueueClient(QueueFunctions):
    """What the worker, the CLI and the HTTP app need from the queue: the hot path, which each
    transport implements, and every other function (QueueFunctions), written once."""

    @abstractmethod
    async def complete_and_claim(
        self,
        worker: str,
        done: list[Done],
        max_jobs: int,
        *,
        kinds: list[str],
        queue: str,
        lease_seconds: int | None = None,
    ) -> list[Job]:
        """Mark the `done` jobs done, storing their results (passing over any whose token is
        stale, silently), and lease up to max_jobs runnable jobs of these kinds on a queue to
        `worker` for `lease_seconds` (None: the lease configured in the database), in one call
        and one transaction; jobs of other kinds stay queued for the workers that handle them.
        max_jobs 0 only completes. A result the database measures over max_result_bytes
        raises TooLarge, and nothing is completed or claimed."""

    @abstractmethod
    async def complete(self, job: Job, result: JsonText | None = None) -> bool:
        """Mark one job done, storing its result; False when its token is stale (the job was
        rescued or finished). TooLarge for a result over max_result_bytes."""

    @abstractmethod
    async def complete_many(self, jobs: list[Job]) -> list[int]:
        """Mark jobs done; returns the ids whose token was still valid."""

    @abstractmethod
    async def fail(
        self,
        job: Job,
        error: str,
        *,
        retryable: bool = True,
        retry_in: timedelta | None = None,
        error_type: str | None = None,
    ) -> FailStatus | None:
        """Record a failed attempt (`error_type`: the error's type, listed with the job's
        errors): 'queued' (retried later), 'failed' (dead letter), or None when the token is
        stale."""

    @abstractmethod
    async def heartbeat_many(self, jobs: list[Job], lease_seconds: int | None = None) -> set[int]:
        """Extend the leases of the claims that hold `jobs` by `lease_seconds` from now (None:
        the lease configured in the database), one renewal per claim, in one call; the ids of
        those still running. A job left out has ended under its token (it
        was cancelled, or its lease ran out and the sweeper took it back): stop it."""

    @abstractmethod
    async def release(self, job: Job) -> bool:
        """Give a claimed job back to the queue without counting the attempt."""

    @abstractmethod
    async def snooze(self, job: Job, delay: timedelta, max_snoozes: int) -> FailStatus | None:
        """Give a claimed job back to run after `delay`, without counting the attempt (a
        Snooze): 'queued'; 'failed' when it had snoozed `max_snoozes` times already (a dead
        letter now); None when the token is stale."""

    @abstractmethod
    async def progress(self, job: Job, progress: JsonText) -> bool:
        """Store how far a running job got (JSON, up to 64 KiB); False when its token is stale
        (another attempt owns the job now, or it was cancelled)."""

    @abstractmethod
    async def wait_for_jobs(self, queue: str, timeout: float) -> bool:
        """Return when jobs may have arrived on `queue` (True: a wake-up said so), or after
        `timeout` seconds (False)."""

    @abstractmethod
    async def close(self) -> None:
        """Close the transport's connections."""
