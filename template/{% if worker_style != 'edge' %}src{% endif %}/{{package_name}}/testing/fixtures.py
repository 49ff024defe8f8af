# Test helper machinery: you should not need to edit this file (handlers live in handlers/).
"""pytest fixtures for tests against the test database; tests/conftest.py loads them with
`pytest_plugins = ["<package>.testing.fixtures"]` and gives the `settings` they use (the test
database, and a queue of the test's own).

- assert_enqueued(kind, payload=..., queue=..., run_after=...): a job enqueued in this test
  matches, or the test fails listing the jobs it enqueued; refute_enqueued() the opposite
- drain_queue(): runs the test's queue through the project's handlers, in-process, and says
  what each job ended as
- queue_clock.advance(interval): the queued jobs fall due that much sooner (clock.py)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, Protocol

import pytest

from ..queue import open_queue
from ..registry import Registry
from ..settings import Settings
from .clock import QueueClock, database_url
from .jobs import Ended, EnqueuedJob, JobFilter, drain, live_jobs, not_found


class AssertEnqueued(Protocol):
    def __call__(
        self,
        kind: str,
        payload: dict[str, Any] | None = None,
        *,
        queue: str | None = None,
        run_after: datetime | None = None,
        tolerance: timedelta = timedelta(seconds=1),
    ) -> list[EnqueuedJob]: ...


class DrainQueue(Protocol):
    def __call__(
        self, *, registry: Registry | None = None, timeout: float = 60.0
    ) -> list[Ended]: ...


def _live(settings: Settings) -> list[EnqueuedJob]:
    async def read() -> list[EnqueuedJob]:
        queue = await open_queue(settings)
        try:
            return await live_jobs(queue)
        finally:
            await queue.close()

    return asyncio.run(read())


def _enqueued_since(settings: Settings) -> Callable[[], list[EnqueuedJob]]:
    """What reads the live jobs enqueued after this call (on any queue)."""
    before = {job.id for job in _live(settings)}
    return lambda: [job for job in _live(settings) if job.id not in before]


@pytest.fixture
def assert_enqueued(settings: Settings) -> AssertEnqueued:
    """Asserts that the test enqueued a job of `kind` (on `queue`, or any; its payload holding
    the keys and values of `payload`; due at `run_after`, within `tolerance`) still queued or
    running; returns the jobs that match. Call it outside the event loop."""
    enqueued = _enqueued_since(settings)

    def check(
        kind: str,
        payload: dict[str, Any] | None = None,
        *,
        queue: str | None = None,
        run_after: datetime | None = None,
        tolerance: timedelta = timedelta(seconds=1),
    ) -> list[EnqueuedJob]:
        wanted = JobFilter(kind, payload, queue, run_after, tolerance)
        jobs = enqueued()
        found = [job for job in jobs if wanted.matches(job)]
        if not found:
            pytest.fail(not_found(wanted, jobs), pytrace=False)
        return found

    return check


@pytest.fixture
def refute_enqueued(settings: Settings) -> AssertEnqueued:
    """Asserts that the test enqueued no job that matches (the arguments of assert_enqueued);
    returns []."""
    enqueued = _enqueued_since(settings)

    def check(
        kind: str,
        payload: dict[str, Any] | None = None,
        *,
        queue: str | None = None,
        run_after: datetime | None = None,
        tolerance: timedelta = timedelta(seconds=1),
    ) -> list[EnqueuedJob]:
        wanted = JobFilter(kind, payload, queue, run_after, tolerance)
        found = [job for job in enqueued() if wanted.matches(job)]
        if found:
            listed = "\n".join(f"  {job}" for job in found)
            pytest.fail(f"enqueued, though it should not be: {wanted}\n{listed}", pytrace=False)
        return []

    return check


@pytest.fixture
def drain_queue(settings: Settings) -> DrainQueue:
    """Runs the due jobs of the test's queue (settings.queue) through the project's handlers
    (or `registry`'s) in-process, until none is due, and returns what each ended as (Ended:
    done with its result, failed with its error and next run_after, dead, ...), by id. Jobs
    retried after a backoff are not due yet: queue_clock.advance() makes them due. Call it
    outside the event loop."""

    def run(*, registry: Registry | None = None, timeout: float = 60.0) -> list[Ended]:
        return asyncio.run(drain(settings, registry, timeout))

    return run


@pytest.fixture
def queue_clock(settings: Settings) -> QueueClock:
    """Moves the test's queue's clock: advance(interval) makes its queued jobs due that much
    sooner; fire(schedule) enqueues a schedule's job now (clock.py)."""
    try:
        url = database_url()
    except LookupError as exc:
        pytest.fail(str(exc), pytrace=False)
    return QueueClock(url, settings.queue)
