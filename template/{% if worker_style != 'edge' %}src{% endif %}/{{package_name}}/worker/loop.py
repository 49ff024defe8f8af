# Worker machinery: you should not need to edit this file (handlers live in handlers/).
"""The worker loop: claim jobs in batches and run up to `concurrency` of them at once.

- It claims only the kinds it has handlers for: a job of another kind stays queued for the
  workers (or the newer release) that handle it.
- Each claim is complete_and_claim(): it also completes the jobs that succeeded since the
  last one, in the same round trip and transaction (completions.py; successes that no claim
  comes for soon are sent alone). Each job runs in a task of its own (job_runner.py); one
  lease keeper per worker renews the leases and enforces the timeouts of every job in hand
  (leases.py). Per job the worker does no round trip of its own, creates one task and no
  timer, so its cost per job stays small.
- A handler's return value is its job's result: it rides along with the completion (a
  result that is not JSON, or over the configured max_result_bytes, fails its job instead;
  queue/results.py). Handlers may report progress as they go (JobInfo.report_progress()).
- A job a signed-in user of the app submitted carries its owner (job.owner), read after the
  claim and only for batches with kinds open to users (queue/owners.py).
- Idle, the worker waits for a wake-up (LISTEN with the postgres transport) or polls with a
  growing pause; it never spins. A lost connection is retried with backoff; the first call
  that gets through again (a claim or a report) ends every other call's pause (Outage).
- stop() (SIGTERM/SIGINT): no more claims; running jobs get `shutdown_grace` seconds to
  finish, and whatever is still running then is cancelled and released to the queue.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable
from typing import TypeVar

from ..queue import Job, QueueClient, QueueUnavailable
from ..queue.owners import JobOwners
from ..registry import Registry, registry
from ..settings import Settings
from .backoff import MAX_OUTAGE_PAUSE, Backoff, Outage
from .completions import Completions, ResultRefused
from .context import WorkerContext
from .health import log_health
from .job_runner import JobRunner
from .metrics import WorkerMetrics
from .tracing import read_traceparents, start_tracing

log = logging.getLogger(__name__)

T = TypeVar("T")

# The pause between polls of an empty queue starts here and doubles up to
# settings.poll_interval.
_FIRST_IDLE_PAUSE = 0.1
# How often a worker tells the database which kinds it claims (the `unclaimed` view counts a
# worker seen in the last 10 minutes).
_CHECKIN_INTERVAL = 60.0
# The largest result a database whose configuration does not say stores (the most it allows).
_MAX_RESULT_BYTES = 65536


class Worker:
    def __init__(
        self,
        queue: QueueClient,
        settings: Settings,
        handlers: Registry = registry,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self._queue = queue
        self._settings = settings
        self._handlers = handlers
        # Counted whether or not they are served (METRICS_PORT): see metrics.py.
        self.metrics = metrics or WorkerMetrics()
        # Spans for handler runs when WORKER_TRACING=on: see tracing.py.
        self._tracing = start_tracing() if settings.tracing else None
        # The kinds open to the app's users, and the owners of their jobs: see queue/owners.py.
        self._owners = JobOwners(queue)
        # Runs each job with the worker's context (context.py), both built when the first run()
        # or drain() starts.
        self._runner: JobRunner | None = None
        self._next_checkin = 0.0
        self._running: dict[asyncio.Task[None], Job] = {}
        self._stopping = asyncio.Event()
        # Shared by every call that waits out an outage (see context.py).
        self._outage = Outage()
        # Set when a job's task ends or stop() is called: the claim loop waits on it.
        self._changed = asyncio.Event()

    @property
    def counts(self) -> Counter[str]:
        """Outcomes so far: done, retried, dead (dead-lettered), lost (lease lost), released."""
        return self.metrics.counts

    @property
    def busy(self) -> int:
        return len(self._running)

    def stop(self) -> None:
        """Stop claiming; run() / drain() then finish or release the jobs they hold."""
        if not self._stopping.is_set():
            log.info("stopping", extra={"event": "worker.stop", "running": len(self._running)})
            # Reports still waiting out an outage get the shutdown grace, then give up.
            self._outage.stop(self._settings.shutdown_grace)
        self._stopping.set()
        self._changed.set()

    def poke(self) -> None:
        """Claim again now, if slots are free: jobs may have arrived (a wake-up came)."""
        self._changed.set()

    async def run(self) -> None:
        """Claim and run jobs until stop() is called."""
        log.info(
            "worker started",
            extra={
                "event": "worker.start",
                "worker": self._settings.worker_name,
                "queue": self._settings.queue,
                "concurrency": self._settings.concurrency,
                "kinds": self._handlers.kinds(),
                # "uvloop", or "asyncio" where uvloop is not installed
                "event_loop": type(asyncio.get_running_loop()).__module__.partition(".")[0],
            },
        )
        await log_health(self._queue)
        try:
            await self._loop(until_idle=False)
        finally:
            await self._checkout()

    async def drain(self) -> None:
        """Claim and run jobs until none is runnable (or stop() is called)."""
        await self._loop(until_idle=True)

    async def _loop(self, *, until_idle: bool) -> None:
        if self._runner is None:
            context = await self._build_context()
            if context is None:
                return  # stopped before the database answered
            self._runner = JobRunner(context, self._ended)
        runner = self._runner
        completions, keeper = runner.completions, runner.keeper
        reporting = asyncio.create_task(completions.run(), name="completions")
        keeping = asyncio.create_task(keeper.run(), name="lease_keeper")
        completions.expect_claims(True)
        try:
            await self._claim_and_start(runner, until_idle=until_idle)
        finally:
            completions.expect_claims(False)  # no more claims: the last successes go alone
            await self._finish()
            # Every job has ended: report the last successes, and stop the keeper.
            completions.close()
            keeper.stop()
            await asyncio.gather(reporting, keeping)

    async def _build_context(self) -> WorkerContext | None:
        """What every part of the worker shares (context.py), once the lease and the result
        size limit are known (_configuration()); None if stopped before the database answered."""
        configured = await self._configuration()
        if configured is None:
            return None
        lease_seconds, max_result_bytes = configured
        self.metrics.expect(self._settings.queue, self._handlers.kinds())
        return WorkerContext(
            settings=self._settings,
            queue=self._queue,
            handlers=self._handlers,
            metrics=self.metrics,
            outage=self._outage,
            tracing=self._tracing,
            lease_seconds=lease_seconds,
            max_result_bytes=max_result_bytes,
        )

    async def _configuration(self) -> tuple[int, int] | None:
        """The lease (WORKER_LEASE_SECONDS, or else the one configured in the database) and
        max_result_bytes, from the database's configuration (`<schema>.configure()`), read
        once: restart workers after `config set lease_seconds=...` or `max_result_bytes=...`.
        Retried with backoff while the queue is unavailable; None if stopped meanwhile."""
        outage = Backoff(0.5, MAX_OUTAGE_PAUSE)
        while not self._stopping.is_set():
            try:
                config = await self._queue.configure()
            except QueueUnavailable as exc:
                await self._wait_out(outage, exc)
                continue
            self._outage.over()
            max_result_bytes = int(config.get("max_result_bytes", _MAX_RESULT_BYTES))
            if self._settings.lease_seconds is not None:
                return self._settings.lease_seconds, max_result_bytes
            lease_seconds = int(config["lease_seconds"])
            log.info(
                "lease from the database configuration: %d s",
                lease_seconds,
                extra={"event": "worker.lease", "lease_seconds": lease_seconds},
            )
            return lease_seconds, max_result_bytes
        return None

    async def _wait_out(self, outage: Backoff, exc: QueueUnavailable) -> None:
        """Pause before retrying a call the queue could not take (or until stop())."""
        delay = outage.next()
        log.warning(
            "queue unavailable, retrying in %.1fs",
            delay,
            extra={"event": "worker.unavailable", "error": str(exc)},
        )
        await self._unless_stopped(self._outage.pause(delay))

    async def _claim_and_start(self, runner: JobRunner, *, until_idle: bool) -> None:
        settings = self._settings
        completions = runner.completions
        idle = Backoff(_FIRST_IDLE_PAUSE, settings.poll_interval)
        outage = Backoff(0.5, MAX_OUTAGE_PAUSE)
        # Claim in batches: wait until a batch's worth of slots is free (half a batch, so the
        # next claim overlaps the last jobs of the previous one), not for every slot.
        refill = max(1, min(settings.batch_size, settings.concurrency) // 2)
        while not self._stopping.is_set():
            free = settings.concurrency - len(self._running)
            if free < refill:
                # The next claim comes when enough jobs end; successes wait for it a little.
                self._changed.clear()
                await self._job_ended()
                continue
            wanted = min(free, settings.batch_size)
            jobs = await self._claim(runner, wanted, outage)
            if jobs is None:
                continue
            if len(jobs) == wanted:
                idle.reset()
                continue
            # The queue has nothing more to give right now.
            if until_idle:
                if not (self._running or completions.pending):
                    return
                # Claim again once a job ends (or now, to carry the last successes).
                if self._running:
                    await self._job_ended()
                continue
            if jobs:
                idle.reset()
            await self._wait_for_jobs(completions, idle.next())

    async def _claim(self, runner: JobRunner, wanted: int, outage: Backoff) -> list[Job] | None:
        """Claim up to `wanted` jobs, the successes so far riding along, and start them; None
        when the claim did not go through (after waiting out an outage)."""
        settings = self._settings
        kinds = self._handlers.kinds()
        completions = runner.completions
        if time.monotonic() >= self._next_checkin:
            await self._checkin(kinds)
        # Leases are counted from before the claim, so renewals are never late. A job that
        # ends, or a poke(), while the claim is under way is seen after it.
        self._changed.clear()
        renew_at = time.monotonic() + runner.context.lease_seconds / 2
        try:
            # The successes so far ride along: one round trip completes them and claims.
            with completions.ride_along() as done:
                jobs = await self._queue.complete_and_claim(
                    settings.worker_name,
                    done,
                    wanted,
                    kinds=kinds,
                    queue=settings.queue,
                    # WORKER_LEASE_SECONDS, or None: the database's own
                    lease_seconds=settings.lease_seconds,
                )
        except QueueUnavailable as exc:
            completions.expect_claims(False)  # no claim before the pause ends
            await self._wait_out(outage, exc)
            completions.expect_claims(True)
            return None
        except ResultRefused as exc:
            # Nothing was completed or claimed; those jobs are being sent alone, so that
            # only the job whose result the database refused fails.
            log.warning(
                "a result was refused with the claim; claiming again",
                extra={"event": "worker.result_refused", "error": str(exc)},
            )
            return None
        outage.reset()
        self._outage.over()  # reports waiting out the outage go now
        self.metrics.claimed(jobs)
        traceparents = await read_traceparents(self._queue, self._tracing, jobs)
        owners = await self._owners.of(jobs)
        for job in jobs:
            self._start_job(runner, job, renew_at, traceparents.get(job.id), owners.get(job.id))
        return jobs

    async def _wait_for_jobs(self, completions: Completions, timeout: float) -> None:
        """Idle: wait for a wake-up, or `timeout` seconds (or until stop())."""
        completions.expect_claims(False)  # no claim before jobs come
        woken = await self._unless_stopped(self._queue.wait_for_jobs(self._settings.queue, timeout))
        if woken is not None:
            self.metrics.woken("notify" if woken else "poll")
        completions.expect_claims(True)

    async def _checkin(self, kinds: list[str]) -> None:
        """Tell the database which kinds this worker claims, and learn which kinds are open
        to the app's users (queue/owners.py); never stops the worker."""
        self._next_checkin = time.monotonic() + _CHECKIN_INTERVAL
        await self._owners.refresh()
        try:
            await self._queue.checkin(self._settings.worker_name, self._settings.queue, kinds)
        except Exception as exc:  # an older database, or an outage the claim will meet too
            log.warning(
                "check-in failed (apply the migrations: supabase migration up): %s",
                exc,
                extra={"event": "worker.checkin_failed", "error": str(exc)},
            )

    async def _checkout(self) -> None:
        """Tell the database this worker stops, so it no longer counts as alive; never
        raises (a worker stopping in an outage is forgotten 10 minutes after its last
        check-in)."""
        try:
            await self._queue.checkout(self._settings.worker_name)
        except Exception as exc:  # a database before 1.1.0, or an outage
            log.warning(
                "check-out failed (apply the migrations: supabase migration up): %s",
                exc,
                extra={"event": "worker.checkout_failed", "error": str(exc)},
            )

    def _start_job(
        self,
        runner: JobRunner,
        job: Job,
        renew_at: float,
        traceparent: str | None,
        owner: str | None,
    ) -> None:
        registration = self._handlers.get(job.kind)
        # The claim named only the kinds registered here, and a registry only ever grows.
        assert registration is not None, f"claimed a job of kind {job.kind!r} with no handler"
        self._running[runner.start(job, registration, renew_at, traceparent, owner)] = job

    def _ended(self, task: asyncio.Task[None]) -> None:
        """A job's task is ending (it says so itself: see JobRunner)."""
        self._running.pop(task, None)
        self._changed.set()

    async def _job_ended(self) -> None:
        """Wait until a job's task ends, poke() or stop() is called, or one of them already
        was since the event was last cleared."""
        if not self._stopping.is_set():  # stop() may have come while we awaited a claim
            await self._changed.wait()

    async def _unless_stopped(self, awaitable: Awaitable[T]) -> T | None:
        """What `awaitable` returns, or None when stop() is called first."""
        task = asyncio.ensure_future(awaitable)
        stopping = asyncio.create_task(self._stopping.wait())
        try:
            await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            task.cancel()
            stopping.cancel()
        if task.cancelled() or not task.done() or task.exception() is not None:
            return None
        return task.result()

    async def _finish(self) -> None:
        """Give running jobs `shutdown_grace` seconds, then cancel (and so release) the rest."""
        if not self._running:
            return
        grace = self._settings.shutdown_grace
        log.info(
            "waiting for running jobs",
            extra={"event": "worker.finish", "running": len(self._running), "grace_s": grace},
        )
        _, unfinished = await asyncio.wait(set(self._running), timeout=grace)
        for task in unfinished:
            task.cancel()
        await asyncio.gather(*unfinished, return_exceptions=True)
        # A task cancelled before it ever ran could not say it ended.
        assert self._runner is not None, "jobs are started only inside _loop()"
        for task in unfinished:
            if self._running.pop(task, None) is not None:
                self._runner.forget(task)
