# Queue client machinery: you should not need to edit this file (handlers live in handlers/).
"""The queue's functions outside the worker's hot path, each written once for both transports.

A transport gives two ways to reach the database: call() runs one function of the queue's
schema (settings.QUEUE_SCHEMA; see supabase/migrations) with named arguments and returns its
rows; read() reads one of its views. Every method here is one of those calls, its arguments
named as the SQL function names them and its rows made typed values (types.py). A new
function of the queue needs one method here, and nothing in the transports.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from .errors import ConfigRefused, Refused
from .types import (
    JobState,
    Metric,
    NewJob,
    OnConflict,
    OnDependencyFailure,
    QueueState,
    Schedule,
    ThroughputPoint,
    WorkflowStep,
)

# A row as the transport read it: column name to value.
Row = dict[str, Any]
# A condition of read(): a column, PostgREST's name of a comparison, a value.
Filter = tuple[str, Literal["eq", "gt"], Any]


@dataclass(frozen=True, slots=True)
class Json:
    """An argument the function takes as jsonb, sent as a JSON document whatever its shape
    (an empty list is the JSON array [], never an empty SQL array)."""

    value: Any


class QueueFunctions(ABC):
    """The queue's functions and views as Python methods, on the transport's call() and read()."""

    @abstractmethod
    async def call(self, function: str, args: Mapping[str, Any] | None = None) -> list[Row]:
        """The rows of `select * from <schema>.<function>(name => value, ...)`. A function that
        returns one value (not a set) gives one row, {function: value}; a set of values, one
        such row per value. Arguments: str, int, float, bool, None, datetime, timedelta, lists
        of these (SQL arrays), and Json for jsonb. A function that returns an SQL array is
        not called this way: over the Data API its value cannot be told from a set's rows.
        Raises QueueUnavailable, Refused or TooLarge as the database answers."""

    @abstractmethod
    async def read(
        self,
        view: str,
        *,
        columns: Sequence[str] = ("*",),
        order: Sequence[str] = (),
        limit: int | None = None,
        where: Sequence[Filter] = (),
    ) -> list[Row]:
        """The `columns` of the rows of a view (or table) of the queue's schema that meet every
        `where` condition, ordered by the `order` columns, at most `limit` of them."""

    async def _value(self, function: str, **args: Any) -> Any:
        """The one value a function returns."""
        return (await self.call(function, args))[0][function]

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
        depends_on: Sequence[int] | None = None,
        on_dependency_failure: OnDependencyFailure = "cancel",
    ) -> int:
        """Enqueue one job and return its id. With a taken idempotency key, the existing
        job's id, the job kept or changed as `on_conflict` says. Jobs sharing a
        `concurrency_key` run at most the key's limit at once (set_concurrency_limit()). A
        W3C `traceparent` is kept with the job for its handler's span (trace_contexts());
        Refused when malformed. With `depends_on` (job ids), it runs once they are all done,
        their results in its handler's job.dependencies; a dependency dead-lettered or
        cancelled cancels it, unless `on_dependency_failure` is 'run' (a Workflow,
        queue/workflow.py, enqueues many such jobs at once)."""
        args: dict[str, Any] = {
            "kind": kind,
            "payload": Json(payload or {}),
            "queue": queue,
            "priority": priority,
            "idempotency_key": idempotency_key,
            "max_attempts": max_attempts,
            "concurrency_key": concurrency_key,
            "on_conflict": on_conflict,
            "traceparent": traceparent,
        }
        if run_after is not None:  # else the function's default: now
            args["run_after"] = run_after
        if depends_on is not None:
            args["depends_on"] = list(depends_on)
            args["on_dependency_failure"] = on_dependency_failure
        return int((await self.call("enqueue", args))[0]["enqueue"])

    async def enqueue_many(self, jobs: list[NewJob]) -> list[int]:
        """Enqueue many jobs in one statement; ids in input order."""
        batch = [job.model_dump(mode="json", exclude_none=True) for job in jobs]
        rows = await self.call("enqueue_many", {"jobs": Json(batch)})
        return [int(row["enqueue_many"]) for row in rows]

    async def dependency_results(self, job_id: int) -> list[Row]:
        """What the jobs `job_id` depends on ended with: id, kind, status, result, error (the
        worker reads them here when the queue left them out of the job's payload)."""
        return await self.call("dependency_results", {"job_id": job_id})

    async def job(self, job_id: int) -> JobState | None:
        """One job by id, live or finished; None for an unknown id (or one pruned)."""
        rows = await self.call("job", {"job_id": job_id})
        return JobState.model_validate(rows[0]) if rows else None

    async def workflow(self, root: int) -> list[WorkflowStep]:
        """Every job of the workflow of job `root` (any of its jobs), in id order; [] for an
        unknown (or pruned) job."""
        rows = await self.call("workflow", {"root": root})
        return [WorkflowStep.model_validate(row) for row in rows]

    async def retry(self, job_id: int) -> bool:
        """Queue a dead-lettered or cancelled job again with fresh attempts."""
        return bool(await self._value("retry", job_id=job_id))

    async def cancel(self, job_id: int) -> bool:
        """Cancel a queued or running job; False when it had already finished."""
        return bool(await self._value("cancel", job_id=job_id))

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
    ) -> list[Row]:
        """A page of the jobs of `status` (waiting, queued, running, done, failed, cancelled;
        None only with an idempotency key) that pass the filters given (`workflow`: any of its
        jobs' id): finished jobs the newest finished first, live ones the newest first. `since`
        and `until` bound when a finished job finished and when a live one was created. The
        next page: the last row's id as `before_id` (and its finished_at as
        `before_finished_at`, for finished jobs)."""
        args = {
            "status": status,
            "kind": kind,
            "queue": queue,
            "idempotency_key": idempotency_key,
            "since": since,
            "until": until,
            "before_id": before_id,
            "before_finished_at": before_finished_at,
            "page_size": page_size,
            "workflow": workflow,
        }
        return await self.call("list_jobs", args)

    async def count_jobs(self, *, status: str | None, cap: int = 10_000, **filters: Any) -> int:
        """How many jobs of `status` pass the filters of list_jobs() (kind, queue,
        idempotency_key, since, until, workflow), counted up to `cap`: cap + 1 means more than
        cap (a workflow's, up to 1,000)."""
        return int(await self._value("count_jobs", status=status, cap=cap, **filters))

    async def retry_jobs(self, *, status: str | None, max_jobs: int = 1000, **filters: Any) -> int:
        """Queue again the dead letters (status "failed"), cancelled jobs, or both (None) that
        pass the filters of list_jobs(), at most `max_jobs` (1 to 1000), the newest finished
        first; how many. Call again until it returns 0, with the same `until`."""
        return int(await self._value("retry_jobs", status=status, max_jobs=max_jobs, **filters))

    async def cancel_jobs(
        self, *, status: str | None = "queued", max_jobs: int = 1000, **filters: Any
    ) -> int:
        """Cancel the queued jobs that pass the filters of list_jobs(), at most `max_jobs` (1 to
        1000), the newest first; how many. Call again until it returns 0."""
        return int(await self._value("cancel_jobs", status=status, max_jobs=max_jobs, **filters))

    async def trace_contexts(self, job_ids: list[int]) -> dict[int, str]:
        """The traceparent each of these live jobs was enqueued with, for those that have one."""
        rows = await self.call("trace_contexts", {"job_ids": job_ids})
        return {int(row["id"]): row["traceparent"] for row in rows}

    async def job_owners(self, job_ids: list[int]) -> dict[int, str]:
        """The owner (auth.users id) of each of these jobs that a signed-in user submitted
        from the app; the other jobs have none."""
        rows = await self.call("job_owners", {"job_ids": job_ids})
        return {int(row["id"]): str(row["owner"]) for row in rows}

    async def allow_client_kind(
        self,
        kind: str,
        per_minute: int,
        *,
        max_per_user: int | None = None,
        max_total: int | None = None,
    ) -> None:
        """Let signed-in users submit jobs of `kind` from the app (client_enqueue()), at most
        `per_minute` a minute each (1 to 10000), with at most `max_per_user` of each user's
        queued or running at once (1 to 10000) and `max_total` of all users' (1 to 1000000).
        A cap not given is 100 and 10,000 for a new kind, and stays as it was for a kind
        already open; again: change the rate and caps. Refused for a bad kind, rate or cap."""
        caps = {"max_per_user": max_per_user, "max_total": max_total}
        args = {"kind": kind, "per_minute": per_minute}
        await self.call(
            "allow_client_kind", args | {k: v for k, v in caps.items() if v is not None}
        )

    async def fail_user_facing(self, job_id: int, lock_token: str, message: str) -> str | None:
        """Fail a running job for good with an error its owner reads in my_jobs (a
        UserFacingError): 'failed', or None when the token is stale."""
        args = {"job_id": job_id, "lock_token": lock_token, "message": message}
        status: str | None = await self._value("fail_user_facing", **args)
        return status

    async def disallow_client_kind(self, kind: str) -> bool:
        """Refuse new submissions of `kind` from the app (jobs already submitted run, and
        their owners still see them); False when it was not open."""
        return bool(await self._value("disallow_client_kind", kind=kind))

    async def client_kinds(self) -> dict[str, int]:
        """The kinds open to signed-in users, each with its per-user rate a minute."""
        rows = await self.read("client_kinds", columns=("kind", "per_minute"), order=["kind"])
        return {row["kind"]: int(row["per_minute"]) for row in rows}

    async def checkin(self, worker: str, queue: str, kinds: list[str]) -> None:
        """Tell the database that `worker` claims `kinds` from `queue` (see `unclaimed`)."""
        await self.call("checkin", {"worker": worker, "queue": queue, "kinds": kinds})

    async def checkout(self, worker: str) -> bool:
        """Forget `worker` (it stops): it no longer counts as alive. False if it had not
        checked in."""
        return bool(await self.call("checkout", {"worker": worker}))

    async def set_concurrency_limit(
        self, concurrency_key: str, max_running: int | None, *, strict: bool = False
    ) -> int | None:
        """Let at most `max_running` jobs of a concurrency key run at once, across all workers;
        None removes the key's own limit. `strict` (with max_running 1): the key's jobs run in
        enqueue order even across retries, a failed job holding the later ones until it
        succeeds, is dead-lettered or is cancelled. Returns the limit now in force (None: no
        limit; a key without its own has the configured default_concurrency_limit)."""
        limit = await self._value(
            "set_concurrency_limit",
            concurrency_key=concurrency_key,
            max_running=max_running,
            strict=strict,
        )
        return None if limit is None else int(limit)

    async def pause(self, queue: str) -> bool:
        """Stop claiming the queue's jobs (running ones finish); False if it was paused."""
        return bool(await self._value("pause", queue=queue))

    async def resume(self, queue: str) -> bool:
        """Claim the queue's jobs again, and wake the workers; False if it was not paused."""
        return bool(await self._value("resume", queue=queue))

    async def set_rate_limit(
        self, queue: str, per_second: float | None, burst: int | None = None
    ) -> None:
        """Start at most `per_second` jobs of the queue a second on average, and `burst` at
        once (default: per_second rounded up); None removes the limit."""
        args = {"queue": queue, "per_second": per_second, "burst": burst}
        await self.call("set_rate_limit", args)

    async def queue_states(self) -> list[QueueState]:
        """Each queue that has jobs, is paused or is rate-limited (`queue_states`)."""
        rows = await self.read("queue_states", order=["queue"])
        return [QueueState.model_validate(row) for row in rows]

    async def schedule(
        self,
        name: str,
        cron: str,
        kind: str,
        payload: dict[str, Any] | None = None,
        *,
        queue: str = "default",
        time_zone: str = "UTC",
        catch_up: bool = False,
    ) -> int:
        """Enqueue a `kind` job on every `cron` slot (five fields, read in `time_zone`, an IANA
        name), one per slot, whatever the overlaps and retries; with `catch_up`, a slot missed
        while nothing ran runs once on return. Scheduling a name again changes it. Returns the
        id of the pg_cron job that runs it."""
        args = {"name": name, "cron": cron, "kind": kind, "payload": Json(payload or {})}
        args |= {"queue": queue, "time_zone": time_zone, "catch_up": catch_up}
        return int((await self.call("schedule", args))[0]["schedule"])

    async def unschedule(self, name: str) -> bool:
        """Stop a recurring job (its queued jobs stay); False when there was none."""
        return bool(await self._value("unschedule", name=name))

    async def schedules(self) -> list[Schedule]:
        """The recurring jobs, by name."""
        rows = await self.read("schedules", order=["name"])
        return [Schedule.model_validate(row) for row in rows]

    async def configure(self, changes: dict[str, Any] | None = None) -> dict[str, Any]:
        """The queue's run-time configuration (defaults for attempts, lease, retention, the
        wake-up URL and the sweeper's schedule), after applying `changes`."""
        try:
            config: dict[str, Any] = await self._value("configure", changes=Json(changes or {}))
        except Refused as exc:
            raise ConfigRefused(exc.message, exc.hint) from exc
        return config

    async def stats(self) -> list[Row]:
        """Rows of the `stats` view: jobs per queue, kind and status, and whether the queue is
        paused."""
        return await self.read("stats", order=["queue", "kind", "status"])

    async def metrics(self) -> list[Metric]:
        """The queue's gauges and counters (`metrics()`), ordered by name then labels."""
        return [Metric.from_row(row) for row in await self.call("metrics")]

    async def throughput(self, minutes: int = 30) -> list[ThroughputPoint]:
        """Jobs finished per minute and queue over the last `minutes` (1 to 1440), oldest
        first, a row for every minute of every queue; Refused outside that range."""
        rows = await self.call("throughput", {"minutes": minutes})
        return [ThroughputPoint.model_validate(row) for row in rows]

    async def health(self) -> list[Row]:
        """Rows of `health()`: component, ok, detail -- what wake-ups and rescues depend on
        (pg_net, the worker URL, the key, recent pg_net failures, the sweeper)."""
        return await self.call("health")

    async def unclaimed(self) -> list[Row]:
        """Rows of the `unclaimed` view: queued jobs per queue and kind that no worker seen in
        the last 10 minutes claims."""
        return await self.read("unclaimed", order=["queue", "kind"])

    async def dead_letters(self, limit: int = 50) -> list[Row]:
        """Rows of the `dead_letters` view, newest first."""
        return await self.read("dead_letters", limit=limit)

    async def retrying(self, limit: int = 50) -> list[Row]:
        """Queued jobs whose last attempt failed, waiting for the next one (soonest first):
        id, queue, kind, attempts, max_attempts, last_error, run_after, created_at."""
        return await self.read(
            "jobs",
            columns=_RETRYING_COLUMNS,
            order=["run_after", "id"],
            limit=limit,
            where=[("status", "eq", "queued"), ("attempts", "gt", 0)],
        )


# What retrying() lists of each queued job that failed before.
_RETRYING_COLUMNS = (
    "id",
    "queue",
    "kind",
    "attempts",
    "max_attempts",
    "last_error",
    "run_after",
    "created_at",
)
