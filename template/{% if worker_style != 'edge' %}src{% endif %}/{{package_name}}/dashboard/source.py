# Dashboard machinery: you should not need to edit this file.
"""What the dashboard reads from the queue and asks of it: the `QueueSource` protocol.

The dashboard imports nothing from the rest of the project. The worker's queue client (either
transport) is a QueueSource as it is, and so is any client of the same SQL functions and
views. Rows of views (`stats`, `dead_letters`, live jobs) come as mappings keyed by the
views' column names; the rest as objects with the attributes below.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

Row = Mapping[str, Any]


class QueueStateRow(Protocol):
    """A row of the `queue_states` view."""

    @property
    def queue(self) -> str: ...
    @property
    def paused(self) -> bool: ...
    @property
    def paused_at(self) -> datetime | None: ...
    @property
    def queued(self) -> int: ...
    @property
    def running(self) -> int: ...


class ThroughputRow(Protocol):
    """A row of `throughput(minutes)`: a queue's jobs finished in one minute."""

    @property
    def minute(self) -> datetime: ...
    @property
    def queue(self) -> str: ...
    @property
    def done(self) -> int: ...
    @property
    def failed(self) -> int: ...
    @property
    def cancelled(self) -> int: ...


class JobRow(Protocol):
    """A row of `job(id)`: one job, live or finished."""

    @property
    def id(self) -> int: ...
    @property
    def queue(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def priority(self) -> int | None: ...
    @property
    def attempts(self) -> int: ...
    @property
    def max_attempts(self) -> int | None: ...
    @property
    def payload(self) -> Any: ...
    @property
    def progress(self) -> Any: ...
    @property
    def result(self) -> Any: ...
    @property
    def last_error(self) -> str | None: ...
    @property
    def concurrency_key(self) -> str | None: ...
    @property
    def idempotency_key(self) -> str | None: ...
    @property
    def run_after(self) -> datetime | None: ...
    @property
    def locked_until(self) -> datetime | None: ...
    @property
    def created_at(self) -> datetime: ...
    @property
    def finished_at(self) -> datetime | None: ...
    @property
    def errors(self) -> Sequence[Any]: ...  # each failed attempt's, oldest first
    @property
    def snoozes(self) -> int: ...
    # In a workflow: the jobs it waits for and those waiting for it, each {id, kind, status}
    # (as mappings or objects), and the workflow's id (its first job's); else [], [], None.
    @property
    def depends_on(self) -> Sequence[Any]: ...
    @property
    def dependents(self) -> Sequence[Any]: ...
    @property
    def workflow_id(self) -> int | None: ...


class WorkflowStep(Protocol):
    """A row of `workflow(root)`: one job of a workflow."""

    @property
    def id(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def depends_on(self) -> Sequence[int]: ...  # the ids of the jobs it waits for
    @property
    def result(self) -> Any: ...
    @property
    def last_error(self) -> str | None: ...


class QueueSource(Protocol):
    """The queue's SQL functions and views, as the dashboard calls them."""

    async def stats(self) -> Sequence[Row]:
        """Rows of the `stats` view: jobs per queue, kind and status."""
        ...

    async def queue_states(self) -> Sequence[QueueStateRow]:
        """Rows of the `queue_states` view: queues with live jobs, a pause or a rate limit."""
        ...

    async def dead_letters(self, limit: int = 50) -> Sequence[Row]:
        """Rows of the `dead_letters` view, newest first."""
        ...

    async def unclaimed(self) -> Sequence[Row]:
        """Rows of the `unclaimed` view: queued jobs per queue and kind that no worker seen in
        the last 10 minutes claims (a kind no handler has, a misspelt one)."""
        ...

    async def retrying(self, limit: int = 50) -> Sequence[Row]:
        """Queued jobs that failed before and wait for their next attempt, soonest first."""
        ...

    async def throughput(self, minutes: int = 30) -> Sequence[ThroughputRow]:
        """Jobs finished per minute and queue over the last `minutes`, oldest first."""
        ...

    async def job(self, job_id: int) -> JobRow | None:
        """One job by id; None for an unknown (or pruned) one."""
        ...

    async def workflow(self, root: int) -> Sequence[WorkflowStep]:
        """Every job of the workflow of job `root` (any of its jobs), in id order."""
        ...

    async def retry(self, job_id: int) -> bool:
        """Queue a dead-lettered or cancelled job again; False for any other."""
        ...

    async def list_jobs(
        self,
        *,
        status: str | None,
        kind: str | None = None,
        queue: str | None = None,
        idempotency_key: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        before_id: int | None = None,
        before_finished_at: datetime | None = None,
        page_size: int = 50,
        workflow: int | None = None,
    ) -> Sequence[Row]:
        """Rows of `list_jobs()`: a page of the jobs of a status that pass the filters given
        (`workflow`: any of its jobs' id), the newest (finished) first, after the row of
        `before_id` (and `before_finished_at`)."""
        ...

    async def count_jobs(
        self,
        *,
        status: str | None,
        kind: str | None = None,
        queue: str | None = None,
        idempotency_key: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        cap: int = 10_000,
        workflow: int | None = None,
    ) -> int:
        """`count_jobs()`: how many jobs pass the filters, up to cap + 1 (more than cap)."""
        ...

    async def retry_jobs(
        self,
        *,
        status: str | None,
        kind: str | None = None,
        queue: str | None = None,
        idempotency_key: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        max_jobs: int = 1000,
        workflow: int | None = None,
    ) -> int:
        """`retry_jobs()`: queue again up to max_jobs dead or cancelled jobs that pass the
        filters (`workflow`: any of its jobs' id), what their failure cancelled waiting again;
        how many."""
        ...

    async def cancel_jobs(
        self,
        *,
        status: str | None,
        kind: str | None = None,
        queue: str | None = None,
        idempotency_key: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        max_jobs: int = 1000,
        workflow: int | None = None,
    ) -> int:
        """`cancel_jobs()`: cancel up to max_jobs queued or waiting jobs that pass the filters
        (`workflow`: any of its jobs' id), and what waits on them; how many."""
        ...

    async def cancel(self, job_id: int) -> bool:
        """Cancel a waiting, queued or running job (and what waits for it); False when it has
        finished."""
        ...

    async def pause(self, queue: str) -> bool:
        """Stop claiming the queue's jobs; False when it was paused already."""
        ...

    async def resume(self, queue: str) -> bool:
        """Claim the queue's jobs again; False when it was not paused."""
        ...
