# Test helper machinery: you should not need to edit this file (handlers live in handlers/).
"""Run one handler in a test, the way the worker would, with no database.

    ran = run_job("send_email", {"to": "ada@example.com", "subject": "Hi", "text": "Hello"})
    assert ran.result is None

The handler registered for the kind runs (handlers/ is loaded, or the registry you pass), with
its payload validated by its model as the worker validates it, a JobInfo shaped by the
arguments, its progress reports kept in order and its result checked and stored as the queue
would store it (JSON). What the handler raises, the call raises (PermanentError, RetryAfter,
any error), so `pytest.raises` tells what the worker would do with the job; a handler still
running after its kind's timeout raises HandlerTimedOut.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from ..dependencies import NO_DEPENDENCIES, Dependencies
from ..queue.results import MAX_PROGRESS_BYTES, to_json_text
from ..registry import JobInfo, Registry, describe_validation_error, load_handlers


class InvalidPayload(ValueError):
    """The payload does not fit the handler's model: the worker would dead-letter the job
    with this message without running the handler."""


class HandlerTimedOut(TimeoutError):
    """The handler was still running after its kind's timeout: the worker would stop it and
    count a failed attempt."""


@dataclass
class HandlerRun:
    """What one run of a handler did: its result as the queue stores it (JSON, models dumped),
    what it returned as it returned it, each progress report (as stored), and the JobInfo it
    was given."""

    job: JobInfo
    result: Any = None
    returned: Any = None
    progress: list[Any] = field(default_factory=list)


async def run_job_async(
    kind: str,
    payload: BaseModel | dict[str, Any] | None = None,
    *,
    registry: Registry | None = None,
    timeout: float | None = None,
    job_id: int = 1,
    queue: str = "default",
    attempt: int = 1,
    max_attempts: int = 5,
    owner: str | None = None,
    dependencies: Dependencies = NO_DEPENDENCIES,
) -> HandlerRun:
    """Run the handler of `kind` on `payload` (a dict, as enqueued, or the payload model) as
    attempt `attempt` of `max_attempts` of job `job_id` on `queue`, for `owner` (a user id, for
    a job a signed-in user submitted), with what the jobs it depended on ended with
    (`dependencies`, e.g. Dependencies.from_rows([{"id": 1, "kind": ..., "status": "done",
    "result": ...}])). `registry`: the handlers (default: handlers/); `timeout`: seconds
    (default: the kind's). For tests that run in an event loop already."""
    handlers = registry if registry is not None else load_handlers()
    registration = handlers.get(kind)
    if registration is None:
        raise LookupError(
            f"no handler for {kind!r}: registered are {', '.join(handlers.kinds()) or 'none'}"
        )
    as_enqueued = payload.model_dump(mode="json") if isinstance(payload, BaseModel) else payload
    try:
        # through JSON, as the queue stores it: a value JSON cannot hold fails here
        as_stored = json.loads(json.dumps(as_enqueued or {}))
        model = registration.payload_model.model_validate(as_stored)
    except ValidationError as exc:
        raise InvalidPayload(
            f"invalid payload for {kind!r}: {describe_validation_error(exc)}"
        ) from exc
    progress: list[Any] = []

    async def report(value: Any) -> bool:
        text = to_json_text(value, what=f"the progress of job {job_id}", limit=MAX_PROGRESS_BYTES)
        progress.append(json.loads(text))
        return True

    info = JobInfo(
        job_id, kind, queue, attempt, max_attempts, owner, dependencies, progress_reporter=report
    )
    seconds = registration.timeout if timeout is None else timeout
    try:
        async with asyncio.timeout(seconds) as deadline:
            returned = await registration.func(model, info)
    except TimeoutError:
        if not deadline.expired():
            raise  # the handler's own
        raise HandlerTimedOut(
            f"the handler of {kind!r} was still running after {seconds:g}s (its timeout): "
            "the worker would stop it and count a failed attempt"
        ) from None
    run = HandlerRun(info, returned=returned, progress=progress)
    if returned is not None:
        what = f"the result of job {job_id} ({kind!r})"
        run.result = json.loads(to_json_text(returned, what=what, limit=MAX_PROGRESS_BYTES))
    return run


def run_job(
    kind: str,
    payload: BaseModel | dict[str, Any] | None = None,
    **job: Any,
) -> HandlerRun:
    """run_job_async() in an event loop of its own, for a plain (sync) test."""
    return asyncio.run(run_job_async(kind, payload, **job))
