# Worker machinery: you should not need to edit this file (handlers live in handlers/).
"""Reports to the queue (completions sent alone, failures, releases, progress), retried through
an outage: a report that gets through ends the pauses of the worker's other calls (Outage)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ..queue import QueueUnavailable
from .backoff import Backoff
from .context import WorkerContext

log = logging.getLogger(__name__)

T = TypeVar("T")

# The longest pause between two tries of a report: its job's lease runs out meanwhile, and a
# report costs the queue little.
MAX_REPORT_PAUSE = 1.0


async def report(call: Callable[[], Awaitable[T]], context: WorkerContext) -> T | None:
    """Tell the queue what happened (`call()`), retrying through an outage for up to one lease
    (after that the sweeper has taken the job back anyway). Between tries it pauses at most
    MAX_REPORT_PAUSE, and no longer than until another of the worker's calls gets through
    (context.outage). None if it never got through."""
    outage = context.outage
    backoff = Backoff(0.2, MAX_REPORT_PAUSE)
    deadline = time.monotonic() + context.lease_seconds
    while True:
        try:
            result = await call()
        except QueueUnavailable as exc:
            if time.monotonic() > deadline:
                log.error(
                    "gave up reporting to the queue",
                    extra={"event": "worker.report_failed", "error": str(exc)},
                )
                return None
            await outage.pause(backoff.next())
        else:
            outage.over()
            return result
