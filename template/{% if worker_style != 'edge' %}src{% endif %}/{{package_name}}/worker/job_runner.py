# Worker machinery: you should not need to edit this file (handlers live in handlers/).
"""One claimed job, from its claim to the outcome the queue records.

The payload is validated with the handler's model, the handler runs in a task of its own, and
the outcome goes back to the queue: success, with the handler's result, to the batched
completions; a failure to fail() with the error (the queue decides between a retry and the
dead letters; a retry comes after the delay a RetryAfter names, else after the kind's own
Backoff, else after the database's backoff()); a UserFacingError to fail_user_facing() (the
job's owner reads its message); a Snooze to snooze() (run again later, the attempt not
counted); a job still running at shutdown to release(). A result that
is not JSON or is over max_result_bytes fails its job for good (queue/results.py). The
handler's progress reports go to the queue as it makes them, with the job's lock token.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ValidationError

from ..dependencies import Dependencies, take_dependencies
from ..queue import Job, JsonText, QueueUnavailable
from ..queue.results import MAX_PROGRESS_BYTES, NotStorable, to_json_text
from ..registry import (
    JobInfo,
    PermanentError,
    Registration,
    RetryAfter,
    Snooze,
    UserFacingError,
    describe_validation_error,
)
from .completions import Completions
from .context import WorkerContext
from .failures import report_failure
from .leases import LeaseKeeper, StopReason
from .logs import describe_exception, describe_failure, job_fields, ms_since
from .metrics import Outcome
from .reports import NotReported, report

log = logging.getLogger(__name__)


class JobRunner:
    """Runs the jobs of one worker, each in a task of its own, with the worker's context; its
    lease keeper keeps their leases, its completions report their successes."""

    def __init__(
        self, context: WorkerContext, on_end: Callable[[asyncio.Task[None]], None]
    ) -> None:
        self.context = context
        self.keeper = LeaseKeeper(context)
        self.completions = Completions(context)
        # Told by each job's own task as it ends (not by a done callback, which the event
        # loop would schedule and run as one more step a job).
        self._on_end = on_end
        self._loop = asyncio.get_running_loop()

    def start(
        self,
        job: Job,
        registration: Registration,
        renew_at: float,
        traceparent: str | None = None,
        owner: str | None = None,
    ) -> asyncio.Task[None]:
        """Run `job` in a task of its own, its lease kept (renewed from `renew_at` on) and its
        handler stopped after the kind's timeout; its span a child of `traceparent` when
        tracing is on; `owner` is the handler's job.owner. The task calls `on_end` as it
        ends; one cancelled before it ever ran does not (see forget())."""
        run = self._run(job, registration, traceparent, owner)
        task = self._loop.create_task(run, name=f"job-{job.id}")
        self.keeper.watch(task, job, renew_at, time.monotonic() + registration.timeout)
        return task

    def forget(self, task: asyncio.Task[None]) -> None:
        """`task` is done without having ended itself (cancelled before it ran)."""
        self.keeper.forget(task)

    async def _run(
        self,
        job: Job,
        registration: Registration,
        traceparent: str | None,
        owner: str | None,
    ) -> None:
        """Run the job; whatever becomes of it, the keeper forgets it and `on_end` is told."""
        task = asyncio.current_task(self._loop)
        assert task is not None, "a job runs in a task of its own"
        try:
            await self._attempt(task, job, registration, traceparent, owner)
        except Exception as exc:
            # _attempt reports every handler error; this is the queue failing to take one.
            log.error(
                "job outcome not recorded; the sweeper will retry the job when its lease ends",
                exc_info=exc,
                extra={"event": "job.unrecorded", **job_fields(job)},
            )
        finally:
            self.keeper.forget(task)
            self._on_end(task)

    async def _attempt(
        self,
        task: asyncio.Task[None],
        job: Job,
        registration: Registration,
        traceparent: str | None,
        owner: str | None,
    ) -> None:
        started = time.monotonic()
        if log.isEnabledFor(logging.INFO):
            log.info("job started", extra={"event": "job.start", **job_fields(job)})
        prepared = await self._prepare(job, registration, started)
        if prepared is None:
            return
        payload, dependencies = prepared
        info = self._info(job, owner, dependencies)
        tracing, began = self.context.tracing, time.monotonic()
        try:
            # No timer per job: the lease keeper cancels this task when its time is up. The
            # handler is awaited here, not in a coroutine of its own: one fewer a job.
            try:
                if tracing is None:
                    returned = await registration.func(payload, info)
                else:
                    with tracing.span(job, traceparent):
                        returned = await registration.func(payload, info)
            finally:  # the handler's time, whatever its outcome
                self.context.metrics.handler_ran(job, time.monotonic() - began)
        except asyncio.CancelledError:
            reason = self.keeper.stopped_because(task)
            if reason is None:
                await self._release(job)  # shutdown
                raise
            task.uncancel()
            await self._stopped(job, reason, registration, started)
            return
        except Exception as exc:
            await self._raised(job, registration, exc, started)
            return
        try:
            result = None if returned is None else self._result(job, returned)
        except NotStorable as exc:
            await self._fail(job, str(exc), "NotStorable", retryable=False, started=started)
            return
        self.completions.add(job, started, result, self.keeper.lease_ends(task))

    async def _prepare(
        self, job: Job, registration: Registration, started: float
    ) -> tuple[BaseModel, Dependencies] | None:
        """The payload of `job` as its handler's model, and what its dependencies ended with
        (taken out of the payload; fetched when the queue left their results out). None when
        the job failed instead: a payload that does not fit fails it for good; the queue
        unavailable for its dependencies' results fails the attempt."""
        try:
            if job.payload_error is not None:
                raise ValueError(job.payload_error)
            body, dependencies = take_dependencies(job.payload)
            payload = registration.payload_model.model_validate(body)
        except ValidationError as exc:
            error = f"invalid payload for {job.kind!r}: {describe_validation_error(exc)}"
            await self._fail(job, error, "InvalidPayload", retryable=False, started=started)
            return None
        except ValueError as exc:
            error = f"invalid payload for {job.kind!r}: {exc}"
            await self._fail(job, error, "InvalidPayload", retryable=False, started=started)
            return None
        if dependencies.results_omitted:
            try:
                rows = await self.context.queue.dependency_results(job.id)
            except QueueUnavailable as exc:
                error = f"the results of its dependencies could not be read: {exc}"
                await self._fail(job, error, "QueueUnavailable", retryable=True, started=started)
                return None
            dependencies = Dependencies.from_rows(rows, results_omitted=True)
        return payload, dependencies

    async def _raised(
        self, job: Job, registration: Registration, exc: Exception, started: float
    ) -> None:
        """The handler of `job` raised `exc`: a Snooze runs the job later, its attempt not
        counted; a PermanentError fails it for good; any other error fails the attempt, retried
        after the delay a RetryAfter names, else after the kind's own Backoff."""
        if isinstance(exc, Snooze):
            await self._snooze(job, exc)
            return
        if isinstance(exc, PermanentError):
            error, shown = _permanent_error(exc)
            await self._fail(job, error, _type_name(exc), shown, retryable=False, started=started)
            return
        retry_in = _retry_in(registration, job, exc)
        # a delay the handler chose is no surprise: its message alone
        chosen = isinstance(exc, RetryAfter)
        error = describe_exception(exc) if chosen else describe_failure(exc)
        await self._fail(
            job, error, _type_name(exc), retryable=True, started=started, retry_in=retry_in
        )

    def _info(self, job: Job, owner: str | None, dependencies: Dependencies) -> JobInfo:
        """What the handler of `job` is told about it (`owner`: who submitted it, if a user;
        `dependencies`: what the jobs it depended on ended with)."""
        return JobInfo(
            job.id,
            job.kind,
            job.queue,
            job.attempts,
            job.max_attempts,
            owner,
            dependencies,
            progress_reporter=functools.partial(self._report_progress, job),
        )

    def _result(self, job: Job, returned: Any) -> JsonText:
        """What the handler of `job` returned, as the JSON text the queue stores; NotStorable
        when it is not JSON or over max_result_bytes."""
        return to_json_text(
            returned,
            what=f"the result of job {job.id} ({job.kind!r})",
            limit=self.context.max_result_bytes,
            limit_name="max_result_bytes",
        )

    async def _stopped(
        self, job: Job, reason: StopReason, registration: Registration, started: float
    ) -> None:
        """The lease keeper stopped the job: it ran out of time (a failed attempt), or its
        lease was lost (another attempt owns it now: nothing to report)."""
        if reason == "timeout":
            error = f"TimeoutError: timed out after {registration.timeout:g}s"
            retry_in = _retry_in(registration, job)
            await self._fail(
                job, error, "TimeoutError", retryable=True, started=started, retry_in=retry_in
            )
            return
        self.context.metrics.finished([job], "lost")
        log.error(
            "job stopped: its lease was lost (another attempt owns it now)",
            extra={"event": "job.lost", "duration_ms": ms_since(started), **job_fields(job)},
        )

    async def _report_progress(self, job: Job, progress: Any) -> bool:
        """JobInfo.report_progress() of `job`: False when its token is stale. Through an outage
        the report is dropped (logged): progress is a hint, not worth failing the job for."""
        text = to_json_text(
            progress, what=f"the progress of job {job.id}", limit=MAX_PROGRESS_BYTES
        )
        try:
            return await self.context.queue.progress(job, text)
        except QueueUnavailable as exc:
            log.warning(
                "progress not reported: the queue is unavailable",
                extra={"event": "job.progress_dropped", "error": str(exc), **job_fields(job)},
            )
            return True

    async def _release(self, job: Job) -> None:
        """Hand a job still running at shutdown back to the queue, so another worker runs it
        now (its attempt not counted)."""
        try:
            released = await report(lambda: self.context.queue.release(job), self.context)
        except NotReported as exc:
            log.warning(
                "job not released at shutdown: the queue was unavailable; the sweeper takes it "
                "back when its lease runs out",
                extra={"event": "job.unreported", "cause": str(exc), **job_fields(job)},
            )
            return
        self.context.metrics.finished([job], "released")
        log.warning(
            "job released at shutdown",
            extra={"event": "job.released", "released": bool(released), **job_fields(job)},
        )

    async def _snooze(self, job: Job, snooze: Snooze) -> None:
        """Hand the job back to run after the delay its handler asked for, its attempt not
        counted (past its max_snoozes, the queue dead-letters it instead)."""
        try:
            status = await report(
                lambda: self.context.queue.snooze(job, snooze.delay, snooze.max_snoozes),
                self.context,
            )
        except NotReported as exc:
            log.warning(
                "job not snoozed: the queue was unavailable; the sweeper takes it back when "
                "its lease runs out",
                extra={"event": "job.unreported", "cause": str(exc), **job_fields(job)},
            )
            return
        outcome: Outcome = (
            "snoozed" if status == "queued" else "dead" if status == "failed" else "lost"
        )
        self.context.metrics.finished([job], outcome)
        log.log(
            logging.ERROR if outcome == "dead" else logging.INFO,
            "job snoozed" if outcome == "snoozed" else "job snoozed past its max_snoozes",
            extra={
                "event": f"job.{outcome}",
                "snooze_seconds": snooze.delay.total_seconds(),
                **job_fields(job),
            },
        )

    async def _fail(
        self,
        job: Job,
        error: str,
        error_type: str,
        shown: str | None = None,
        *,
        retryable: bool,
        started: float,
        retry_in: timedelta | None = None,
    ) -> None:
        await report_failure(
            self.context,
            job,
            error,
            error_type=error_type,
            retryable=retryable,
            started=started,
            shown=shown,
            retry_in=retry_in,
        )


def _retry_in(
    registration: Registration, job: Job, error: BaseException | None = None
) -> timedelta | None:
    """The pause before the next attempt of `job` after a failed one: the delay a RetryAfter
    names, else the kind's own Backoff, else None for the database's backoff()."""
    if isinstance(error, RetryAfter):
        return error.delay
    backoff = registration.backoff
    return None if backoff is None else backoff.delay(job.attempts)


def _type_name(exc: BaseException) -> str:
    """The error's type as its attempt records it: its class's name, as describe_exception()
    begins the message (`KeyError`, `HTTPStatusError`)."""
    return type(exc).__name__


def _permanent_error(exc: PermanentError) -> tuple[str, str | None]:
    """The last_error of a job a handler failed for good, and for a UserFacingError the
    message its owner reads in my_jobs (reported with fail_user_facing(), told by its type)."""
    if isinstance(exc, UserFacingError):
        return describe_exception(exc), str(exc)
    return str(exc), None
