# Worker machinery: you should not need to edit this file (handlers live in handlers/).
"""Pauses that double up to a limit (between empty polls, through outages), and reports to
the queue retried through an outage."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from .queue_client import QueueUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")

# The longest pause between two tries while the queue is unavailable.
MAX_OUTAGE_PAUSE = 30.0


class Backoff:
    """`next()` returns `first`, then twice that, and so on up to `maximum`; `reset()` starts
    over."""

    def __init__(self, first: float, maximum: float) -> None:
        self.first, self.maximum = first, maximum
        self._next = first

    def next(self) -> float:
        delay, self._next = self._next, min(self._next * 2, self.maximum)
        return delay

    def reset(self) -> None:
        self._next = self.first


async def report(call: Callable[[], Awaitable[T]], *, give_up_after: float) -> T | None:
    """Tell the queue what happened (`call()`), retrying through an outage for up to
    `give_up_after` seconds (one lease: after that the sweeper has taken the job back anyway).
    None if it never got through."""
    backoff = Backoff(0.2, MAX_OUTAGE_PAUSE)
    deadline = time.monotonic() + give_up_after
    while True:
        try:
            return await call()
        except QueueUnavailable as exc:
            if time.monotonic() > deadline:
                log.error(
                    "gave up reporting to the queue",
                    extra={"event": "worker.report_failed", "error": str(exc)},
                )
                return None
            await asyncio.sleep(backoff.next())
