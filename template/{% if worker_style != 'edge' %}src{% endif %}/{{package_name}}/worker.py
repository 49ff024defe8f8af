# Worker machinery: you should not need to edit this file (handlers live in handlers/).
"""The worker loop: claim jobs in batches, run up to `concurrency` at once, report back.

- Each job runs its kind's handler with the payload validated by the handler's model, under
  the kind's timeout. Jobs that run longer than half their lease get their lease extended.
- Success is reported in batches (complete_many); a failure goes to fail() with the error,
  and the queue decides between a retry with backoff and the dead letters.
- Idle, the worker waits for a wake-up (LISTEN with the postgres transport) or polls with a
  growing pause; it never spins. A lost connection is retried with backoff.
- stop() (SIGTERM/SIGINT): no more claims; running jobs get `shutdown_grace` seconds to
  finish, and whatever is still running then is cancelled and released to the queue.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
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


class _Backoff:
    def __init__(self, first: float, maximum: float) -> None:
        self.first, self.maximum = first, maximum
        self._next = first

    def next(self) -> float:
        delay, self._next = self._next, min(self._next * 2, self.maximum)
        return delay

    def reset(self) -> None:
        self._next = self.first


class Worker:
    def __init__(
        self, queue: QueueClient, settings: Settings, handlers: Registry = registry
    ) -> None:
        self._queue = queue
        self._settings = settings
        self._handlers = handlers
        self._stopping = asyncio.Event()
        self._running: dict[asyncio.Task[None], Job] = {}
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
        self._completions = _Completions(self._queue, self._report)
        try:
            # Claim in batches: wait until a batch's worth of slots is free (half a batch, so
            # the next claim overlaps the last jobs of the previous one), not for every slot.
            refill = max(1, min(settings.batch_size, settings.concurrency) // 2)
            while not self._stopping.is_set():
                free = settings.concurrency - len(self._running)
                if free < refill:
                    await self._wait_for(*self._running)
                    continue
                wanted = min(free, settings.batch_size)
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
                    await self._wait_for(asyncio.sleep(delay))
                    continue
                outage.reset()
                for job in jobs:
                    task = asyncio.create_task(self._run_job(job), name=f"job-{job.id}")
                    self._running[task] = job
                    task.add_done_callback(self._forget)
                if len(jobs) == wanted:
                    idle.reset()
                    continue
                # The queue has nothing more to give right now.
                if until_idle:
                    if not self._running:
                        break
                    await self._wait_for(*self._running)
                    continue
                if jobs:
                    idle.reset()
                await self._wait_for(self._queue.wait_for_jobs(settings.queue, idle.next()))
        finally:
            await self._finish()

    def _forget(self, task: asyncio.Task[None]) -> None:
        job = self._running.pop(task, None)
        if not task.cancelled() and (exc := task.exception()) is not None:
            # _run_job reports every handler error; this is the queue failing to take one.
            fields = {"job_id": job.id, "kind": job.kind} if job else {}
            log.error(
                "job outcome not recorded; the sweeper will retry the job when its lease ends",
                exc_info=exc,
                extra={"event": "job.unrecorded", **fields},
            )

    async def _wait_for(self, *awaitables: Awaitable[Any]) -> None:
        """Wait until the first of `awaitables` is done, or stop() is called."""
        tasks = {asyncio.ensure_future(a) for a in awaitables}
        stopping = asyncio.create_task(self._stopping.wait())
        try:
            await asyncio.wait({*tasks, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            # Only cancel what this call created; job tasks are not ours to cancel here.
            for task in {stopping, *tasks} - set(self._running):
                task.cancel()

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

    async def _run_job(self, job: Job) -> None:
        started = time.monotonic()
        fields = {"job_id": job.id, "kind": job.kind, "attempt": job.attempts, "queue": job.queue}
        log.info("job started", extra={"event": "job.start", **fields})
        registration = self._handlers.get(job.kind)
        if registration is None:
            known = ", ".join(self._handlers.kinds()) or "none"
            error = (
                f"no handler for kind {job.kind!r} (this worker handles: {known}); add a "
                f"module under handlers/ with @handler({job.kind!r}) and deploy it"
            )
            # Retryable: during a rolling deploy, a newer worker may know the kind.
            await self._fail(job, error, retryable=True, started=started, fields=fields)
            return
        if job.payload_error is not None:
            error = f"invalid payload for {job.kind!r}: {job.payload_error}"
            await self._fail(job, error, retryable=False, started=started, fields=fields)
            return
        try:
            payload = registration.payload_model.model_validate(job.payload)
        except ValidationError as exc:
            error = f"invalid payload for {job.kind!r}: {describe_validation_error(exc)}"
            await self._fail(job, error, retryable=False, started=started, fields=fields)
            return

        info = JobInfo(job.id, job.kind, job.queue, job.attempts, job.max_attempts)
        work = asyncio.create_task(self._call(registration, payload, info))
        lease = asyncio.create_task(self._keep_leased(job, work))
        try:
            await work
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                # Shutdown: hand the job back so another worker runs it now.
                released = await self._report(self._queue.release, job)
                self.counts["released"] += 1
                log.warning(
                    "job released at shutdown",
                    extra={"event": "job.released", "released": bool(released), **fields},
                )
                raise
            self.counts["lost"] += 1
            log.error(
                "job stopped: its lease was lost (another attempt owns it now)",
                extra={"event": "job.lost", "duration_ms": _ms_since(started), **fields},
            )
            return
        except PermanentError as exc:
            await self._fail(job, str(exc), retryable=False, started=started, fields=fields)
            return
        except Exception as exc:
            await self._fail(job, _describe(exc), retryable=True, started=started, fields=fields)
            return
        finally:
            lease.cancel()

        done = await self._completions_or_fail().complete(job)
        self.counts["done" if done else "lost"] += 1
        log.info(
            "job done" if done else "job done, but its lease had been lost",
            extra={"event": "job.done", "duration_ms": _ms_since(started), **fields},
        )

    def _completions_or_fail(self) -> _Completions:
        if self._completions is None:
            raise RuntimeError("jobs run only inside Worker.run() or Worker.drain()")
        return self._completions

    @staticmethod
    async def _call(registration: Registration, payload: Any, info: JobInfo) -> None:
        timeout = asyncio.timeout(registration.timeout)
        try:
            async with timeout:
                await registration.func(payload, info)
        except TimeoutError as exc:
            if timeout.expired():
                raise TimeoutError(f"timed out after {registration.timeout:g}s") from exc
            raise

    async def _keep_leased(self, job: Job, work: asyncio.Task[None]) -> None:
        """Extend the lease every half lease; if it was lost, stop the handler."""
        lease_seconds = self._settings.lease_seconds
        while True:
            await asyncio.sleep(lease_seconds / 2)
            try:
                kept = await self._queue.heartbeat(job, lease_seconds)
            except QueueUnavailable as exc:
                log.warning(
                    "heartbeat failed",
                    extra={"event": "job.heartbeat_failed", "job_id": job.id, "error": str(exc)},
                )
                continue
            if not kept:
                work.cancel()
                return

    async def _fail(
        self,
        job: Job,
        error: str,
        *,
        retryable: bool,
        started: float,
        fields: dict[str, Any],
    ) -> None:
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
                **fields,
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
    next batch gathers, so a busy worker completes many jobs per round trip."""

    def __init__(self, queue: QueueClient, report: Callable[..., Awaitable[Any]]) -> None:
        self._queue = queue
        self._report = report
        self._pending: list[tuple[Job, asyncio.Future[bool]]] = []
        self._flushing = False
        self._arrived = asyncio.Event()
        self._flusher = asyncio.create_task(self._flush_forever(), name="complete_many")

    async def complete(self, job: Job) -> bool:
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pending.append((job, future))
        self._arrived.set()
        return await asyncio.shield(future)

    async def _flush_forever(self) -> None:
        while True:
            await self._arrived.wait()
            self._arrived.clear()
            self._flushing = True
            while self._pending:
                batch = self._pending[:_COMPLETE_BATCH]
                del self._pending[:_COMPLETE_BATCH]
                try:
                    done = await self._report(self._queue.complete_many, [job for job, _ in batch])
                except Exception as exc:
                    for _, future in batch:
                        future.set_exception(exc)
                    continue
                completed = set(done or ())
                for job, future in batch:
                    future.set_result(job.id in completed)
            self._flushing = False

    async def close(self) -> None:
        """Stop once every completion handed in so far has been reported."""
        while self._pending or self._flushing:
            await asyncio.sleep(0.01)
        self._flusher.cancel()


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
