# Worker machinery: you should not need to edit this file (handlers live in handlers/).
"""Reports to the queue (completions sent alone, failures, releases), retried through an outage
until they get through or the worker stops: a report that gets through ends the pauses of the
worker's other calls (Outage)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from ..queue import QueueUnavailable
from .backoff import Backoff
from .context import WorkerContext

T = TypeVar("T")

# The longest pause between two tries of a report: its job's lease may run out meanwhile, and
# a report costs the queue little.
MAX_REPORT_PAUSE = 1.0


class NotReported(Exception):
    """The worker stopped, and its shutdown grace ran out, while the queue was unavailable:
    the report was not made. The job stays running until its lease runs out and the sweeper
    takes it back."""


async def report(call: Callable[[], Awaitable[T]], context: WorkerContext) -> T:
    """Tell the queue what happened (`call()`), retrying through an outage for as long as it
    lasts: the database takes the report until a sweep takes the job back, even after the
    job's lease ran out, and a report it no longer takes answers so (a stale token), so
    there is no time after which trying again is pointless. Between tries it pauses at most
    MAX_REPORT_PAUSE, and no longer than until another of the worker's calls gets through
    (context.outage). NotReported when the worker stops first (after its shutdown grace)."""
    outage = context.outage
    backoff = Backoff(0.2, MAX_REPORT_PAUSE)
    while True:
        try:
            result = await call()
        except QueueUnavailable as exc:
            if outage.giving_up:
                raise NotReported(str(exc)) from exc
            await outage.pause(backoff.next())
        else:
            outage.over()
            return result
