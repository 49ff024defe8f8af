# Queue client machinery: you should not need to edit this file (handlers live in handlers/).
"""The queue functions' arguments and rows, as typed Python values: the same whichever
transport read them (pydantic turns the Data API's JSON text and psycopg's values alike into
these types)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, get_args

from pydantic import BaseModel

# What a job does when a job it depends on is dead-lettered or cancelled: it is cancelled too
# (`cancel`), or it runs anyway, told which failed (`run`).
OnDependencyFailure = Literal["cancel", "run"]


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
    # Run only once these jobs are done (ids of jobs enqueued before), and these jobs of the
    # same enqueue_many() call (their indexes in its list): a Workflow's steps
    # (queue/workflow.py). What a failed or cancelled dependency does to this job:
    # `cancel` it (the default) or `run` it anyway (job.dependencies says which failed).
    depends_on: list[int] | None = None
    depends_on_index: list[int] | None = None
    on_dependency_failure: OnDependencyFailure | None = None


# What enqueue() does when a live job already holds its idempotency key: `keep` it as it is,
# `replace` a waiting job's payload, run_after, priority and max_attempts, or `debounce` (a
# waiting job takes the new payload and the later run_after).
OnConflict = Literal["keep", "replace", "debounce"]
ON_CONFLICT: tuple[OnConflict, ...] = get_args(OnConflict)

FailStatus = Literal["queued", "failed"]


class AttemptError(BaseModel):
    """The error one failed attempt of a job ended with, as `job(id)` lists it."""

    attempt: int
    at: datetime
    worker: str | None
    type: str | None
    message: str


class RelatedJob(BaseModel):
    """A job that another waits for, or that waits for another, as `job(id)` lists them."""

    id: int
    kind: str | None  # None: pruned
    status: str | None


class JobState(BaseModel):
    """One job as `job(id)` finds it, live or finished: its state, how far it got, what it
    returned, its last error and each failed attempt's (`errors`, oldest first, the newest 20),
    and how many times it snoozed; in a workflow, the jobs it waits for (`depends_on`), those
    that wait for it (`dependents`) and the workflow's id (its first job's). Fields a finished
    job no longer has are None (a done job keeps no payload; one kept by batch, no priority or
    max_attempts)."""

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
    errors: list[AttemptError] = []
    snoozes: int = 0
    depends_on: list[RelatedJob] = []
    dependents: list[RelatedJob] = []
    workflow_id: int | None = None


class WorkflowStep(BaseModel):
    """A row of `workflow(root)`: one job of a workflow, the ids of the jobs it waits for, and
    its result (kept while a job waits for it, or when the handler returned one) or error."""

    id: int
    kind: str
    status: str
    depends_on: list[int]
    result: Any
    last_error: str | None


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
    """A row of the `schedules` view: a recurring job, the state and last run of the pg_cron
    job that runs it, and its next runs (instants, and the local times they stand for)."""

    name: str
    cron: str
    kind: str
    payload: Any
    queue: str
    active: bool | None
    last_run_at: datetime | None
    last_run_status: str | None
    created_at: datetime
    time_zone: str
    catch_up: bool
    last_slot: datetime | None
    next_runs: list[datetime] | None
    next_runs_local: list[datetime] | None
