# Worker machinery: you should not need to edit this file (handlers live in handlers/).
"""Failed attempts, reported to the queue (which retries the job later or dead-letters it),
counted and logged. An error the handler raised for the job's owner to read (a
UserFacingError) is reported as such, with fail_user_facing(): the queue tells it by the call,
never by the text of the error."""

from __future__ import annotations

import logging
from datetime import timedelta

from ..queue import Job
from .context import WorkerContext
from .logs import job_fields, ms_since
from .metrics import Outcome
from .reports import NotReported, report

log = logging.getLogger(__name__)


async def report_failure(
    context: WorkerContext,
    job: Job,
    error: str,
    *,
    retryable: bool,
    started: float,
    error_type: str | None = None,
    shown: str | None = None,
    retry_in: timedelta | None = None,
) -> None:
    """Record a failed attempt of `job` (its handler started at `started`, a time.monotonic()
    reading) with `error`, of type `error_type` (both listed with the job's errors); counted
    retried, dead, or lost when its token was stale (the job was taken back). With `shown`, the
    job fails for good and `shown` is the message its owner reads in my_jobs. A retried job
    runs again after `retry_in`, or the database's backoff()."""
    queue = context.queue

    async def fail() -> str | None:
        if shown is not None:
            return await queue.fail_user_facing(job.id, job.lock_token, shown)
        return await queue.fail(
            job, error, retryable=retryable, retry_in=retry_in, error_type=error_type
        )

    try:
        status = await report(fail, context)
    except NotReported as exc:
        log.error(
            "job failed, but not reported: the worker stopped while the queue was unavailable; "
            "the sweeper takes the job back when its lease runs out",
            extra={"event": "job.unreported", "error": error, "cause": str(exc), **job_fields(job)},
        )
        return
    outcome: Outcome = "retried" if status == "queued" else "dead" if status == "failed" else "lost"
    context.metrics.finished([job], outcome)
    log.log(
        logging.ERROR if outcome == "dead" else logging.WARNING,
        "job failed",
        extra={
            "event": f"job.{outcome}",
            "duration_ms": ms_since(started),
            "error": error,
            **job_fields(job),
        },
    )
