# Worker machinery: you should not need to edit this file (handlers live in handlers/).
"""The worker loop: claim jobs in batches, run up to `concurrency` at once, report back.

- Each job runs its kind's handler, in a task of its own, with the payload validated by the
  handler's model. One keeper per worker watches every job in hand: it extends the lease of
  each job that has held it for half its length, stops a job whose lease was lost, and stops
  a handler that runs past its kind's timeout.
- Success is reported in batches (complete_many); a failure goes to fail() with the error,
  and the queue decides between a retry with backoff and the dead letters.
- Per job the worker does no round trip of its own, creates one task and no timer: claims,
  completions, lease renewals and deadlines are shared by every job in hand, so its cost per
  job stays small.
- Idle, the worker waits for a wake-up (LISTEN with the postgres transport) or polls with a
  growing pause; it never spins. A lost connection is retried with backoff.
- stop() (SIGTERM/SIGINT): no more claims; running jobs get `shutdown_grace` seconds to
  finish, and whatever is still running then is cancelled and released to the queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import ValidationError

from .queue_client import Job, QueueClient, QueueUnavailable
from .registry import JobInfo, PermanentError, Registration, Registry, registry
from .settings import Settings

log = logging.getLogger(__name__)

T = TypeVar("T")

# Pause between polls of an empty queue starts here and doubles up to settings.poll_interval.
_FIRST_IDLE_PAUSE = 0.1
_MAX_OUTAGE_PAUSE = 30.0
_COMPLETE_BATCH = 500
# How long a job of a kind this worker has no handler for may take to be failed.
_NO_HANDLER_TIMEOUT = 60.0


class _Backoff:
    def __init__(self, first: float, maximum: float) -> None:
        self.first, self.maximum = first, maximum
        self._next = first

    def next(self) -> float:
        delay, self._next = self._next, min(self._next * 2, self.maximum)
        return delay

    def reset(self) -> None:
        self._next = self.first


@dataclass
class _Running:
    """A job in hand: when its lease is next due for renewal and when its handler's time is
    up (monotonic clock)."""

    job: Job
    renew_at: float
    deadline: float


class Worker:
    def __init__(
        self, queue: QueueClient, settings: Settings, handlers: Registry = registry
    ) -> None:
        self._queue = queue
        self._settings = settings
        self._handlers = handlers
        self._stopping = asyncio.Event()
        # Set when a job's task ends or stop() is called: the claim loop waits on it.
        self._changed = asyncio.Event()
        self._running: dict[asyncio.Task[None], _Running] = {}
        # Why the keeper cancelled a job's task: its lease was lost, or its time was up.
        self._lease_lost: set[asyncio.Task[None]] = set()
        self._timed_out: set[asyncio.Task[None]] = set()
        # Wakes the keeper early, for a job due before the time it sleeps until.
        self._keeper_poke = asyncio.Event()
        self._keeper_wakes_at = 0.0
        self._completions: _Completions | None = None
        # Outcomes so far: done, retried, dead (dead-lettered), lost (lease lost), released.
        self.counts: Counter[str] = Counter()

    @property
    def busy(self) -> int:
        return len(self._running)

    def stop(self) -> None:
        """Stop claiming; run() / drain() then finish or release the jobs they hold."""
        if not self._stopping.is_set():
            log.info("stopping", extra={"event": "worker.stop", "running": len(self._running)})
        self._stopping.set()
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
            },
        )
        await self._loop(until_idle=False)

    async def drain(self) -> None:
        """Claim and run jobs until none is runnable (or stop() is called)."""
        await self._loop(until_idle=True)

    async def _loop(self, *, until_idle: bool) -> None:
        settings = self._settings
        idle = _Backoff(_FIRST_IDLE_PAUSE, settings.poll_interval)
        outage = _Backoff(0.5, _MAX_OUTAGE_PAUSE)
        self._completions = _Completions(self._queue, self._report, self._completed)
        keeper = asyncio.create_task(self._keep(), name="keeper")
        try:
            # Claim in batches: wait until a batch's worth of slots is free (half a batch, so
            # the next claim overlaps the last jobs of the previous one), not for every slot.
            refill = max(1, min(settings.batch_size, settings.concurrency) // 2)
            while not self._stopping.is_set():
                free = settings.concurrency - len(self._running)
                if free < refill:
                    await self._job_ended()
                    continue
                wanted = min(free, settings.batch_size)
                # Leases are counted from before the claim, so renewals are never late.
                renew_at = time.monotonic() + settings.lease_seconds / 2
                try:
                    jobs = await self._queue.claim(
                        settings.worker_name,
                        wanted,
                        queue=settings.queue,
                        lease_seconds=settings.lease_seconds,
                    )
                except QueueUnavailable as exc:
                    delay = outage.next()
                    log.warning(
                        "queue unavailable, retrying in %.1fs",
                        delay,
                        extra={"event": "worker.unavailable", "error": str(exc)},
                    )
                    await self._unless_stopped(asyncio.sleep(delay))
                    continue
                outage.reset()
                for job in jobs:
                    self._start(job, renew_at)
                if len(jobs) == wanted:
                    idle.reset()
                    continue
                # The queue has nothing more to give right now.
                if until_idle:
                    if not self._running:
                        break
                    await self._job_ended()
                    continue
                if jobs:
                    idle.reset()
                await self._unless_stopped(self._queue.wait_for_jobs(settings.queue, idle.next()))
        finally:
            await self._finish()
            keeper.cancel()

    def _start(self, job: Job, renew_at: float) -> None:
        registration = self._handlers.get(job.kind)
        timeout = registration.timeout if registration else _NO_HANDLER_TIMEOUT
        deadline = time.monotonic() + timeout
        task = asyncio.create_task(self._run_job(job, registration), name=f"job-{job.id}")
        self._running[task] = _Running(job, renew_at, deadline)
        task.add_done_callback(self._forget)
        if min(deadline, renew_at) < self._keeper_wakes_at:
            self._keeper_poke.set()

    async def _job_ended(self) -> None:
        """Wait until a job's task ends (or stop() is called)."""
        self._changed.clear()
        if not self._stopping.is_set():  # stop() may have come while we awaited a claim
            await self._changed.wait()

    def _forget(self, task: asyncio.Task[None]) -> None:
        running = self._running.pop(task, None)
        self._lease_lost.discard(task)
        self._timed_out.discard(task)
        self._changed.set()
        if not task.cancelled() and (exc := task.exception()) is not None:
            # _run_job reports every handler error; this is the queue failing to take one.
            fields = _fields(running.job) if running else {}
            log.error(
                "job outcome not recorded; the sweeper will retry the job when its lease ends",
                exc_info=exc,
                extra={"event": "job.unrecorded", **fields},
            )

    async def _unless_stopped(self, awaitable: Awaitable[Any]) -> None:
        """Wait for `awaitable`, or until stop() is called."""
        task = asyncio.ensure_future(awaitable)
        stopping = asyncio.create_task(self._stopping.wait())
        try:
            await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            task.cancel()
            stopping.cancel()

    async def _finish(self) -> None:
        if self._running:
            grace = self._settings.shutdown_grace
            log.info(
                "waiting for running jobs",
                extra={"event": "worker.finish", "running": len(self._running), "grace_s": grace},
            )
            _, unfinished = await asyncio.wait(set(self._running), timeout=grace)
            for task in unfinished:
                task.cancel()
            await asyncio.gather(*unfinished, return_exceptions=True)
        if self._completions is not None:
            await self._completions.close()

    async def _run_job(self, job: Job, registration: Registration | None) -> None:
        started = time.monotonic()
        if log.isEnabledFor(logging.INFO):
            log.info("job started", extra={"event": "job.start", **_fields(job)})
        if registration is None:
            known = ", ".join(self._handlers.kinds()) or "none"
            error = (
                f"no handler for kind {job.kind!r} (this worker handles: {known}); add a "
                f"module under handlers/ with @handler({job.kind!r}) and deploy it"
            )
            # Retryable: during a rolling deploy, a newer worker may know the kind.
            await self._fail(job, error, retryable=True, started=started)
            return
        if job.payload_error is not None:
            error = f"invalid payload for {job.kind!r}: {job.payload_error}"
            await self._fail(job, error, retryable=False, started=started)
            return
        try:
            payload = registration.payload_model.model_validate(job.payload)
        except ValidationError as exc:
            error = f"invalid payload for {job.kind!r}: {describe_validation_error(exc)}"
            await self._fail(job, error, retryable=False, started=started)
            return

        info = JobInfo(job.id, job.kind, job.queue, job.attempts, job.max_attempts)
        try:
            # No timer per job: the keeper cancels this task when its deadline passes.
            await registration.func(payload, info)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task in self._timed_out:
                task.uncancel()
                error = f"TimeoutError: timed out after {registration.timeout:g}s"
                await self._fail(job, error, retryable=True, started=started)
                return
            if task is None or task not in self._lease_lost:
                # Shutdown: hand the job back so another worker runs it now.
                released = await self._report(self._queue.release, job)
                self.counts["released"] += 1
                log.warning(
                    "job released at shutdown",
                    extra={"event": "job.released", "released": bool(released), **_fields(job)},
                )
                raise
            task.uncancel()
            self.counts["lost"] += 1
            log.error(
                "job stopped: its lease was lost (another attempt owns it now)",
                extra={"event": "job.lost", "duration_ms": _ms_since(started), **_fields(job)},
            )
            return
        except PermanentError as exc:
            await self._fail(job, str(exc), retryable=False, started=started)
            return
        except Exception as exc:
            await self._fail(job, _describe(exc), retryable=True, started=started)
            return
        # Reported with other jobs' successes in one complete_many(); see _completed().
        self._completions_or_fail().add(job, started)

    def _completed(self, job: Job, started: float, done: bool) -> None:
        self.counts["done" if done else "lost"] += 1
        if log.isEnabledFor(logging.INFO):
            log.info(
                "job done" if done else "job done, but its lease had been lost",
                extra={"event": "job.done", "duration_ms": _ms_since(started), **_fields(job)},
            )

    def _completions_or_fail(self) -> _Completions:
        if self._completions is None:
            raise RuntimeError("jobs run only inside Worker.run() or Worker.drain()")
        return self._completions

    async def _keep(self) -> None:
        """One loop for all the jobs in hand: stop each handler whose time is up, extend the
        lease of each job that has held it for half its length, stop the handler of a job
        whose lease was lost. Sleeps until the next of those is due (or a job due sooner
        arrives)."""
        while True:
            try:
                await self._keep_once()
            except Exception:
                # Never let one bad turn end the loop: every job's lease depends on it.
                log.exception("lease keeper failed", extra={"event": "worker.keeper_failed"})
                await asyncio.sleep(1.0)

    async def _keep_once(self) -> None:
        now = time.monotonic()
        watched = [
            (task, running)
            for task, running in self._running.items()
            if not (task.done() or task in self._timed_out or task in self._lease_lost)
        ]
        due = []
        for task, running in watched:
            if running.deadline <= now:
                self._timed_out.add(task)
                task.cancel()
            elif running.renew_at <= now:
                due.append((task, running))
        if due:
            await asyncio.gather(*(self._renew(task, running) for task, running in due))
        times = [min(r.renew_at, r.deadline) for t, r in watched if t not in self._timed_out]
        self._keeper_wakes_at = min(times, default=now + self._settings.lease_seconds / 2)
        self._keeper_poke.clear()
        delay = max(0.001, self._keeper_wakes_at - time.monotonic())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._keeper_poke.wait(), delay)

    async def _renew(self, task: asyncio.Task[None], running: _Running) -> None:
        lease_seconds = self._settings.lease_seconds
        sent = time.monotonic()
        try:
            kept = await self._queue.heartbeat(running.job, lease_seconds)
        except Exception as exc:  # QueueUnavailable, or the queue refusing the call
            log.warning(
                "heartbeat failed, retrying",
                extra={
                    "event": "job.heartbeat_failed",
                    "job_id": running.job.id,
                    "error": _describe(exc),
                },
            )
            running.renew_at = time.monotonic() + min(1.0, lease_seconds / 4)
            return
        if kept:
            running.renew_at = sent + lease_seconds / 2
        elif not task.done():
            self._lease_lost.add(task)
            task.cancel()

    async def _fail(self, job: Job, error: str, *, retryable: bool, started: float) -> None:
        status = await self._report(self._queue.fail, job, error, retryable=retryable)
        outcome = {"queued": "retried", "failed": "dead"}.get(str(status), "lost")
        self.counts[outcome] += 1
        log.log(
            logging.ERROR if outcome == "dead" else logging.WARNING,
            "job failed",
            extra={
                "event": f"job.{outcome}",
                "duration_ms": _ms_since(started),
                "error": error,
                **_fields(job),
            },
        )

    async def _report(
        self, call: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any
    ) -> T | None:
        """Tell the queue what happened, retrying through an outage for up to one lease (after
        that the sweeper has taken the job back anyway). None if it never got through."""
        backoff = _Backoff(0.2, _MAX_OUTAGE_PAUSE)
        deadline = time.monotonic() + self._settings.lease_seconds
        while True:
            try:
                return await call(*args, **kwargs)
            except QueueUnavailable as exc:
                if time.monotonic() > deadline:
                    log.error(
                        "gave up reporting to the queue",
                        extra={"event": "worker.report_failed", "error": str(exc)},
                    )
                    return None
                await asyncio.sleep(backoff.next())


class _Completions:
    """Batches successful jobs into complete_many() calls: while one call is in flight, the
    next batch gathers, so a busy worker completes many jobs per round trip. A job's slot is
    free as soon as its handler returns; `completed(job, started, done)` is called once the
    queue has answered for it."""

    def __init__(
        self,
        queue: QueueClient,
        report: Callable[..., Awaitable[Any]],
        completed: Callable[[Job, float, bool], None],
    ) -> None:
        self._queue = queue
        self._report = report
        self._completed = completed
        self._pending: list[tuple[Job, float]] = []
        self._flushing = False
        self._arrived = asyncio.Event()
        self._flusher = asyncio.create_task(self._flush_forever(), name="complete_many")

    def add(self, job: Job, started: float) -> None:
        self._pending.append((job, started))
        self._arrived.set()

    async def _flush_forever(self) -> None:
        while True:
            await self._arrived.wait()
            self._arrived.clear()
            self._flushing = True
            while self._pending:
                batch = self._pending[:_COMPLETE_BATCH]
                del self._pending[:_COMPLETE_BATCH]
                jobs = [job for job, _ in batch]
                try:
                    done = await self._report(self._queue.complete_many, jobs)
                except Exception as exc:
                    log.error(
                        "job outcomes not recorded; the sweeper will retry the jobs when their "
                        "leases end",
                        exc_info=exc,
                        extra={"event": "job.unrecorded", "job_ids": [job.id for job in jobs]},
                    )
                    continue
                completed = set(done or ())
                for job, started in batch:
                    self._completed(job, started, job.id in completed)
            self._flushing = False

    async def close(self) -> None:
        """Stop once every completion handed in so far has been reported."""
        while self._pending or self._flushing:
            await asyncio.sleep(0.01)
        self._flusher.cancel()


def _fields(job: Job) -> dict[str, Any]:
    """What every log line about a job carries."""
    return {"job_id": job.id, "kind": job.kind, "attempt": job.attempts, "queue": job.queue}


def _ms_since(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 1)


def describe_validation_error(exc: ValidationError) -> str:
    """pydantic's errors on one line: `to: String should match pattern ...; text: Field
    required`."""
    return "; ".join(
        f"{'.'.join(map(str, error['loc'])) or 'payload'}: {error['msg']}"
        for error in exc.errors(include_url=False)
    )


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
