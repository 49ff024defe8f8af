# Worker machinery: you should not need to edit this file (handlers live in handlers/).
"""Successful jobs, reported to the queue in batches, most of them with the next claim.

A job's slot in the worker is free as soon as its handler returns; its success waits here
until one of two calls takes it:
- the claim loop's next claim (ride_along()): complete_and_claim() completes the jobs done so
  far and claims the next batch in one round trip and one transaction;
- run(), which sends alone (complete_many()) what no claim takes in time: at once while the
  claim loop expects no claim (the queue is empty, an outage, stopping), and otherwise what
  has waited RIDE_ALONG seconds (every slot is busy with long jobs, or a claim is slow).
  While one such call is in flight the next batch gathers.
Either way a success reaches the queue within about RIDE_ALONG seconds plus one round trip,
long before the lease of its job (no longer renewed) can end.

Results go with their jobs: in complete_and_claim()'s done_results, and alone with one
complete() per job that has one (jobs without a result go together, with complete_many()).
The worker checked each result's size (queue/results.py), but the database measures the jsonb it
stores, and refuses a whole claim whose result it finds over max_result_bytes. Then nothing
was completed or claimed, and the claim's jobs are sent alone at once (ResultRefused tells the
claim loop to claim again): only the job whose result is refused fails, with the database's
measure as its error.

Through an outage a success is retried until the database answers (reports.report()): at
once when the worker's claim gets through again, however long after its job's lease ran out,
since the database takes it until a sweep takes the job back. complete_many() and complete()
answer which jobs they completed, so each success is logged as what it came to: `job.done`;
`job.done_late` when it landed after its job's lease ran out (before any sweep); and
`job.done_refused` when the job had been taken back (the sweeper rescued it, or it was
cancelled) and the success was not recorded: counted lost, the job runs again. A success whose
lease runs out within LATE seconds never rides along with a claim, which would pass over a
stale token silently; it goes alone. When the worker stops before the queue is back (after its
shutdown grace), the successes still waiting are logged `job.unreported`: the sweeper takes
their jobs back when their leases run out, and they run again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import operator
import time
from collections.abc import Iterator
from dataclasses import dataclass

from ..queue import Done, Job, JsonText, Refused, TooLarge
from ..queue.results import STORE_ELSEWHERE
from .context import WorkerContext
from .failures import report_failure
from .logs import job_fields, ms_since
from .reports import NotReported, report

log = logging.getLogger(__name__)

# The most jobs one call reports.
BATCH = 500
# How long a success waits for a claim to carry it before it is sent alone, in seconds.
RIDE_ALONG = 0.05
# A success whose lease runs out within this many seconds goes alone, not with a claim.
LATE = 1.0


@dataclass(slots=True)
class _Done(Done):
    """A success waiting here: one object a job, the Done the transports read and more."""

    started: float  # when its handler started (time.monotonic())
    added: float  # when it was handed in (time.monotonic())
    lease_ends: float  # when its job's lease runs out (time.monotonic())


_LEASE_ENDS = operator.attrgetter("lease_ends")


class ResultRefused(Exception):
    """The database refused a result that rode along with a claim: nothing was completed or
    claimed, and the claim's successes are being sent alone. Claim again."""


class Completions:
    def __init__(self, context: WorkerContext) -> None:
        self._context = context
        self._pending: list[_Done] = []
        # Successes of a claim the database refused for a result: sent alone, at once.
        self._alone: list[_Done] = []
        # Set when run() may have something to send now: add(), expect_claims(), close().
        self._changed = asyncio.Event()
        self._claims_expected = True
        self._closing = False

    @property
    def pending(self) -> int:
        """How many successes wait to be reported."""
        return len(self._pending) + len(self._alone)

    def add(
        self,
        job: Job,
        started: float,
        result: JsonText | None = None,
        lease_ends: float | None = None,
    ) -> None:
        """Report `job` (whose handler started at `started`, a time.monotonic() reading) done,
        with its `result` (checked by queue/results.py); its lease runs out at `lease_ends`
        (default: a whole lease from now)."""
        now = time.monotonic()
        ends = now + self._context.lease_seconds if lease_ends is None else lease_ends
        self._pending.append(_Done(job, result, started, now, ends))
        if not self._claims_expected or len(self._pending) == 1:
            self._changed.set()

    def expect_claims(self, expected: bool) -> None:
        """Whether the claim loop will claim again soon (it is claiming, or waits for slots to
        free up). While it will not, successes are sent alone at once."""
        self._claims_expected = expected
        if not expected:
            self._changed.set()

    @contextlib.contextmanager
    def ride_along(self) -> Iterator[list[Done]]:
        """The successes waiting here (up to BATCH of them), for a claim that completes them
        (complete_and_claim): counted done when the block ends, handed back to run() to send
        alone if it raises. If the database refused one of their results, they are sent
        alone at once, and ResultRefused is raised instead."""
        batch, self._pending[:BATCH] = self._pending[:BATCH], []
        soon = time.monotonic() + LATE
        if late := [entry for entry in batch if entry.lease_ends <= soon]:
            # complete_and_claim() would pass over a stale token silently: alone, they say.
            batch = [entry for entry in batch if entry.lease_ends > soon]
            self._alone.extend(late)
            self._changed.set()
        try:
            done: list[Done] = list(batch)
            yield done
        except Refused as exc:
            if not any(entry.result is not None for entry in batch):
                self._hand_back(batch)
                raise
            self._alone.extend(batch)
            self._changed.set()
            raise ResultRefused(str(exc)) from exc
        except BaseException:
            self._hand_back(batch)
            raise
        self._record(batch, None)

    def _hand_back(self, batch: list[_Done]) -> None:
        self._pending[:0] = batch
        self._changed.set()

    async def run(self) -> None:
        """Send alone what no claim takes in time, until close() is called and everything
        handed in so far is reported."""
        try:
            while self._pending or self._alone or not self._closing:
                if self._alone:
                    batch, self._alone = self._alone, []
                    await self._send(batch)
                    continue
                due_in = self._due_in()
                if due_in is None or due_in > 0:
                    self._changed.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._changed.wait(), due_in)
                    continue
                batch, self._pending[:BATCH] = self._pending[:BATCH], []
                await self._send(batch)
        finally:
            self._closing = False  # ready for the next run()

    def close(self) -> None:
        """Let run() return once everything handed in so far is reported."""
        self._closing = True
        self._changed.set()

    def _due_in(self) -> float | None:
        """Seconds until what is pending must be sent alone; None when nothing is pending."""
        if not self._pending:
            return None
        if self._closing or not self._claims_expected:
            return 0.0
        return self._pending[0].added + RIDE_ALONG - time.monotonic()

    async def _send(self, batch: list[_Done]) -> None:
        """Report `batch` done: the jobs without a result in one call, each other one in a
        call of its own."""
        plain = [entry for entry in batch if entry.result is None]
        if plain:
            await self._send_plain(plain)
        await asyncio.gather(
            *(self._send_result(entry) for entry in batch if entry.result is not None)
        )

    async def _send_plain(self, batch: list[_Done]) -> None:
        jobs, queue = [entry.job for entry in batch], self._context.queue
        try:
            completed = await report(lambda: queue.complete_many(jobs), self._context)
        except NotReported as exc:
            self._unreported(batch, exc)
            return
        except Exception as exc:
            log.error(
                "job outcomes not recorded; the sweeper will retry the jobs when their leases end",
                exc_info=exc,
                extra={"event": "job.unrecorded", "job_ids": [job.id for job in jobs]},
            )
            return
        self._record(batch, set(completed))

    async def _send_result(self, entry: _Done) -> None:
        job, result, queue = entry.job, entry.result, self._context.queue
        try:
            completed = await report(lambda: queue.complete(job, result), self._context)
        except Refused as exc:
            # Over max_result_bytes as the database measures it: the job fails for good.
            error = f"the database refused the result: {exc}"
            if isinstance(exc, TooLarge):
                error = f"{exc.message}: {STORE_ELSEWHERE}"
            await report_failure(self._context, job, error, retryable=False, started=entry.started)
            return
        except NotReported as exc:
            self._unreported([entry], exc)
            return
        except Exception as exc:
            log.error(
                "job outcome not recorded; the sweeper will retry the job when its lease ends",
                exc_info=exc,
                extra={"event": "job.unrecorded", **job_fields(job)},
            )
            return
        self._record([entry], {job.id} if completed else set())

    def _record(self, batch: list[_Done], completed: set[int] | None) -> None:
        """Count and log the jobs of `batch`, reported; `completed`: the ids the queue said it
        completed, None when it does not say."""
        jobs, metrics = [entry.job for entry in batch], self._context.metrics
        if completed is None:
            metrics.finished(jobs, "done")
        else:
            metrics.finished([job for job in jobs if job.id in completed], "done")
            metrics.finished([job for job in jobs if job.id not in completed], "lost")
        info, now = log.isEnabledFor(logging.INFO), time.monotonic()
        if not info and completed is None and min(map(_LEASE_ENDS, batch), default=now) >= now:
            return  # nothing to log: none refused, none late, and job.done not logged
        for entry in batch:
            refused = completed is not None and entry.job.id not in completed
            late = now > entry.lease_ends
            if refused or late or info:
                _log_done(entry, refused=refused, late=late)

    def _unreported(self, batch: list[_Done], exc: NotReported) -> None:
        """The worker stopped before the queue took these successes: say so, job by job."""
        for entry in batch:
            log.error(
                "job done, but not reported: the worker stopped while the queue was unavailable;"
                " the sweeper takes the job back when its lease runs out, and it runs again",
                extra={
                    "event": "job.unreported",
                    "cause": str(exc),
                    "duration_ms": ms_since(entry.started),
                    **job_fields(entry.job),
                },
            )


def _log_done(entry: _Done, *, refused: bool, late: bool) -> None:
    fields = {"duration_ms": ms_since(entry.started), **job_fields(entry.job)}
    if refused:
        log.warning(
            "job done, but the queue refused its success: the job had been taken back (its "
            "lease ran out and the sweeper rescued it, or it was cancelled); it runs again "
            "unless it was cancelled",
            extra={"event": "job.done_refused", **fields},
        )
    elif late:
        log.warning(
            "job done, reported late: after its lease ran out, before any sweep took it back",
            extra={"event": "job.done_late", **fields},
        )
    else:
        log.info("job done", extra={"event": "job.done", **fields})
