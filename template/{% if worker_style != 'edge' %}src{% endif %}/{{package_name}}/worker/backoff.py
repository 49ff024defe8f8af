# Worker machinery: you should not need to edit this file (handlers live in handlers/).
"""Pauses that double up to a limit (between empty polls, through outages), and the outage a
worker's calls wait out together.

Every call of a worker that waits out an outage pauses through the worker's one Outage, and
every call that gets through ends the others' pauses: when the queue answers a claim again,
the successes waiting to be reported go at once (their jobs' leases are running out), and
when a report gets through first (reports.py), the claim loop claims at once."""

from __future__ import annotations

import asyncio
import contextlib
import time

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


class Outage:
    """What a worker's calls share while the queue is unavailable: each one that failed
    waits out its pause in pause(); the first that gets through calls over(), which ends
    every pause under way, so the others try again at once. Once the worker stops, the calls
    still waiting keep trying for its shutdown grace, and then give up (giving_up)."""

    def __init__(self) -> None:
        self._over = asyncio.Event()
        self._pausing = 0
        self._give_up_at: float | None = None

    def stop(self, grace: float) -> None:
        """The worker stops: calls waiting out the outage give up `grace` seconds from now."""
        if self._give_up_at is None:
            self._give_up_at = time.monotonic() + grace

    @property
    def giving_up(self) -> bool:
        """Has the worker stopped, and its grace for calls waiting out an outage run out?"""
        return self._give_up_at is not None and time.monotonic() >= self._give_up_at

    async def pause(self, seconds: float) -> None:
        """Sleep `seconds` (no later than when the calls give up), or until over() is
        called."""
        if self._give_up_at is not None:
            seconds = max(0.0, min(seconds, self._give_up_at - time.monotonic()))
        over = self._over
        self._pausing += 1
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(over.wait(), seconds)
        finally:
            self._pausing -= 1

    def over(self) -> None:
        """A call got through: end every pause under way (a claim calls this each time, so
        it costs nothing while none is)."""
        if self._pausing:
            self._over.set()
            self._over = asyncio.Event()
