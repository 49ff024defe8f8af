"""Tests a project's user might write, each wrong on purpose: the template's
tests/worker/test_project_test_helpers.py runs them in a rendered project and reads how each
helper fails (or reports) them."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from my_app.queue import NewJob, open_queue
from my_app.registry import JobInfo, Registry
from my_app.settings import Settings
from my_app.testing import HandlerTimedOut, run_job
from my_app.testing.clock import QueueClock
from my_app.testing.fixtures import AssertEnqueued, DrainQueue
from pydantic import BaseModel

EMAIL = {"to": "ada@example.com", "subject": "Hi", "text": "Hello"}


class Wait(BaseModel):
    seconds: float = 0
    error: str | None = None


def planted() -> Registry:
    registry = Registry()

    @registry.handler("hang", timeout=1)
    async def hang(payload: Wait, job: JobInfo) -> None:
        await asyncio.sleep(3600)

    @registry.handler("double", timeout=5)
    async def double(payload: Wait, job: JobInfo) -> float:
        await asyncio.sleep(payload.seconds)
        if payload.error:
            raise RuntimeError(payload.error)
        return payload.seconds * 3  # wrong on purpose: 3, not 2

    return registry


def put(settings: Settings, *jobs: NewJob) -> None:
    async def enqueue() -> None:
        queue = await open_queue(settings)
        try:
            await queue.enqueue_many([j.model_copy(update={"queue": settings.queue}) for j in jobs])
        finally:
            await queue.close()

    asyncio.run(enqueue())


def test_wrong_enqueue(settings: Settings, assert_enqueued: AssertEnqueued) -> None:
    put(settings, NewJob(kind="send_email", payload={**EMAIL, "to": "bob@example.com"}))
    assert_enqueued("send_email", {"to": "ada@example.com"})


def test_unwanted_enqueue(settings: Settings, refute_enqueued: AssertEnqueued) -> None:
    put(settings, NewJob(kind="send_email", payload=EMAIL))
    refute_enqueued("send_email", {"to": "ada@example.com"})


def test_wrong_result(settings: Settings, drain_queue: DrainQueue) -> None:
    put(settings, NewJob(kind="double", payload={"seconds": 1}))
    [ended] = drain_queue(registry=planted())
    assert ended.result == 2, f"drained: {ended}"


def test_failing_handler(settings: Settings, drain_queue: DrainQueue) -> None:
    put(settings, NewJob(kind="double", payload={"error": "the API is down"}))
    [ended] = drain_queue(registry=planted())
    assert ended.outcome == "done", f"drained: {ended}"


def test_never_finishing_handler_times_out_in_the_drain(
    settings: Settings, drain_queue: DrainQueue
) -> None:
    put(settings, NewJob(kind="hang"))
    [ended] = drain_queue(registry=planted())
    assert ended.outcome == "done", f"drained: {ended}"


def test_drain_that_does_not_end(settings: Settings, drain_queue: DrainQueue) -> None:
    put(settings, NewJob(kind="double", payload={"seconds": 4}))
    drain_queue(registry=planted(), timeout=1)


def test_never_finishing_handler_run_alone() -> None:
    run_job("hang", registry=planted())


def test_wrong_result_run_alone() -> None:
    assert run_job("double", {"seconds": 1}, registry=planted()).result == 2


def test_clock_moves_only_the_test_queue(
    settings: Settings, queue_clock: QueueClock, drain_queue: DrainQueue
) -> None:
    put(settings, NewJob(kind="send_email", payload=EMAIL))
    with pytest.raises(HandlerTimedOut):
        run_job("hang", registry=planted(), timeout=0.1)
    assert queue_clock.advance(timedelta(hours=1), queue="another-queue") == 0
    assert queue_clock.advance(timedelta(hours=1)) == 1
