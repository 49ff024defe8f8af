# Worker machinery: you should not need to edit this file (handlers live in handlers/).
"""The queue client: one interface over the queue's SQL functions, whatever the transport.

Every method is one call to a function in the queue's schema (settings.QUEUE_SCHEMA; see
supabase/migrations); no queue logic lives in Python. The transport module this project was
generated with implements it, and its `open_queue(settings)` returns one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, NewType, Protocol, get_args

from pydantic import BaseModel
from pydantic_core import from_json


class QueueUnavailable(Exception):
    """The database or the Data API cannot be reached right now; retry with backoff."""


class Refused(ValueError):
    """The database refused a call's arguments (a value out of range, a cron schedule pg_cron
    cannot read, an unknown setting) and changed nothing; the message says what and why."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(f"{message} ({hint})" if hint else message)
        self.message = message
        self.hint = hint


class ConfigRefused(Refused):
    """The database refused a configuration change; the message says which setting and why."""


class TooLarge(Refused):
    """The database refused a value over its size limit (SQLSTATE 54000): a result over
    max_result_bytes, progress over 64 KiB, a payload over 1 MiB."""


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


@dataclass(frozen=True, slots=True)
class Done:
    """A job whose handler returned, and its result (None: the handler returned none)."""

    job: Job
    result: JsonText | None = None


class NewJob(BaseModel):
    """One job for enqueue_many(); unset fields take the queue's defaults."""

    kind: str
    payload: dict[str, Any] = {}
    run_after: datetime | None = None
    idempotency_key: str | None = None
    queue: str | None = None
    priority: int | None = None
    max_attempts: int | None = None
    concurrency_key: str | None = None
    # A W3C traceparent (00-<trace-id>-<parent-id>-<flags>): the job's handler span joins
    # that trace. The database refuses a malformed one.
    traceparent: str | None = None


# What enqueue() does when a live job already holds its idempotency key: `keep` it as it is,
# `replace` a waiting job's payload, run_after, priority and max_attempts, or `debounce` (a
# waiting job takes the new payload and the later run_after).
OnConflict = Literal["keep", "replace", "debounce"]
ON_CONFLICT: tuple[OnConflict, ...] = get_args(OnConflict)

FailStatus = Literal["queued", "failed"]


class JobState(BaseModel):
    """One job as `job(id)` finds it, live or finished: its state, how far it got, what it
    returned and its last error. Fields a finished job no longer has are None (a done job
    keeps no payload; one kept by batch, no priority or max_attempts)."""

    id: int
    queue: str
    kind: str
    status: str
    priority: int | None
    attempts: int
    max_attempts: int | None
    payload: Any
    progress: Any
    result: Any
    last_error: str | None
    concurrency_key: str | None
    idempotency_key: str | None
    run_after: datetime | None
    locked_until: datetime | None
    created_at: datetime
    finished_at: datetime | None


class QueueState(BaseModel):
    """A row of the `queue_states` view: a queue that has jobs, is paused or is rate-limited."""

    queue: str
    paused: bool
    paused_at: datetime | None
    rate_per_second: float | None
    rate_burst: int | None
    queued: int
    running: int


class Metric(BaseModel):
    """A row of `metrics()`: one Prometheus sample. `name` ends in _total for counters; the
    others are gauges (docs/observability.md lists them)."""

    name: str
    labels: dict[str, str]
    value: float

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Metric:
        return cls(name=row["metric"], labels=row["labels"], value=row["value"])


class ThroughputPoint(BaseModel):
    """A row of `throughput()`: the jobs of one queue that finished in one minute (`failed`:
    dead-lettered)."""

    minute: datetime
    queue: str
    done: int
    failed: int
    cancelled: int


class Schedule(BaseModel):
    """A row of the `schedules` view: a recurring job, with its pg_cron state and last run."""

    name: str
    cron: str
    kind: str
    payload: Any
    queue: str
    active: bool | None
    last_run_at: datetime | None
    last_run_status: str | None
    created_at: datetime


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
        concurrency_key: str | None = None,
        on_conflict: OnConflict = "keep",
        traceparent: str | None = None,
    ) -> int:
        """Enqueue one job and return its id. With a taken idempotency key, the existing
        job's id, the job kept or changed as `on_conflict` says. Jobs sharing a
        `concurrency_key` run at most the key's limit at once (set_concurrency_limit()). A
        W3C `traceparent` is kept with the job for its handler's span (trace_contexts());
        Refused when malformed."""
        ...

    async def enqueue_many(self, jobs: list[NewJob]) -> list[int]:
        """Enqueue many jobs in one statement; ids in input order."""
        ...

    async def complete_and_claim(
        self,
        worker: str,
        done: list[Done],
        max_jobs: int,
        *,
        kinds: list[str],
        queue: str,
        lease_seconds: int,
    ) -> list[Job]:
        """Mark the `done` jobs done, storing their results (passing over any whose token is
        stale, silently), and lease up to max_jobs runnable jobs of these kinds on a queue to
        `worker`, in one call and one transaction; jobs of other kinds stay queued for the
        workers that handle them. max_jobs 0 only completes. A result the database measures
        over max_result_bytes raises TooLarge, and nothing is completed or claimed."""
        ...

    async def complete(self, job: Job, result: JsonText | None = None) -> bool:
        """Mark one job done, storing its result; False when its token is stale (the job was
        rescued or finished). TooLarge for a result over max_result_bytes."""
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

    async def heartbeat_many(self, jobs: list[Job], lease_seconds: int) -> set[int]:
        """Extend the leases of the claims that hold `jobs` (one renewal per claim, in one
        call); the ids of those still running. A job left out has ended under its token (it
        was cancelled, or its lease ran out and the sweeper took it back): stop it."""
        ...

    async def release(self, job: Job) -> bool:
        """Give a claimed job back to the queue without counting the attempt."""
        ...

    async def progress(self, job: Job, progress: JsonText) -> bool:
        """Store how far a running job got (JSON, up to 64 KiB); False when its token is stale
        (another attempt owns the job now, or it was cancelled)."""
        ...

    async def job(self, job_id: int) -> JobState | None:
        """One job by id, live or finished; None for an unknown id (or one pruned)."""
        ...

    async def retry(self, job_id: int) -> bool:
        """Queue a dead-lettered or cancelled job again with fresh attempts."""
        ...

    async def cancel(self, job_id: int) -> bool:
        """Cancel a queued or running job; False when it had already finished."""
        ...

    async def stats(self) -> list[dict[str, Any]]:
        """Rows of the `stats` view: jobs per queue, kind and status, and whether the queue is
        paused."""
        ...

    async def metrics(self) -> list[Metric]:
        """The queue's gauges and counters (`metrics()`), ordered by name then labels."""
        ...

    async def throughput(self, minutes: int = 30) -> list[ThroughputPoint]:
        """Jobs finished per minute and queue over the last `minutes` (1 to 1440), oldest
        first, a row for every minute of every queue; Refused outside that range."""
        ...

    async def trace_contexts(self, job_ids: list[int]) -> dict[int, str]:
        """The traceparent each of these live jobs was enqueued with, for those that have one."""
        ...

    async def set_concurrency_limit(
        self, concurrency_key: str, max_running: int | None
    ) -> int | None:
        """Let at most `max_running` jobs of a concurrency key run at once, across all workers;
        None removes the key's own limit. Returns the limit now in force (None: no limit; a
        key without its own has the configured default_concurrency_limit)."""
        ...

    async def pause(self, queue: str) -> bool:
        """Stop claiming the queue's jobs (running ones finish); False if it was paused."""
        ...

    async def resume(self, queue: str) -> bool:
        """Claim the queue's jobs again, and wake the workers; False if it was not paused."""
        ...

    async def set_rate_limit(
        self, queue: str, per_second: float | None, burst: int | None = None
    ) -> None:
        """Start at most `per_second` jobs of the queue a second on average, and `burst` at
        once (default: per_second rounded up); None removes the limit."""
        ...

    async def queue_states(self) -> list[QueueState]:
        """Each queue that has jobs, is paused or is rate-limited (`queue_states`)."""
        ...

    async def schedule(
        self,
        name: str,
        cron: str,
        kind: str,
        payload: dict[str, Any] | None = None,
        *,
        queue: str = "default",
    ) -> int:
        """Enqueue a `kind` job on every `cron` slot (pg_cron syntax), one per slot, whatever
        the overlaps and retries; scheduling a name again changes it. Returns pg_cron's job
        id."""
        ...

    async def unschedule(self, name: str) -> bool:
        """Stop a recurring job (its queued jobs stay); False when there was none."""
        ...

    async def schedules(self) -> list[Schedule]:
        """The recurring jobs, by name."""
        ...

    async def dead_letters(self, limit: int = 50) -> list[dict[str, Any]]:
        """Rows of the `dead_letters` view, newest first."""
        ...

    async def retrying(self, limit: int = 50) -> list[dict[str, Any]]:
        """Queued jobs whose last attempt failed, waiting for the next one (soonest first):
        id, queue, kind, attempts, max_attempts, last_error, run_after, created_at."""
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

    async def wait_for_jobs(self, queue: str, timeout: float) -> bool:
        """Return when jobs may have arrived on `queue` (True: a wake-up said so), or after
        `timeout` seconds (False)."""
        ...

    async def close(self) -> None: ...
