# Worker machinery: you should not need to edit this file (handlers live in handlers/).
"""Prometheus metrics: what this worker did, counted as it happens (metrics_server.py serves
them at `GET /metrics`, with what the queue holds, when METRICS_PORT is set).

The worker's own counters live in a registry of their own (not prometheus_client's global
one), so a scrape shows exactly the queue's metrics. Every one of them is named
`pgqueue_worker_*` and labelled with the job's `queue` and `kind`, except wake-ups
(`source`). An outcome is counted once the queue has recorded it: a success when its
completion was sent (alone, or riding along with the next claim), a failure when fail()
answered whether the job goes back to the queue or to the dead letters. Claims and
completions are counted once per batch and kind (an increment takes a lock), handler
durations once per job, in a histogram counted here (HandlerDurations: no lock, one bisect).
"""

from __future__ import annotations

import bisect
import collections
import itertools
import operator
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.metrics_core import Metric as MetricFamily
from prometheus_client.utils import floatToGoString

from ..queue import Job

# What became of a claimed job, as Worker.counts names it.
Outcome = Literal["done", "retried", "dead", "lost", "released", "snoozed"]
# What sent the worker looking for jobs: a NOTIFY (postgres transport), a POST /wake
# (python-http), or its own timer (an idle wait that ran out, or the idle poll).
WakeupSource = Literal["notify", "http", "poll"]
WAKEUP_SOURCES: tuple[WakeupSource, ...] = ("notify", "http", "poll")

# What each metric of <schema>.metrics() means (its HELP line); a name not listed here is
# served all the same, with a generic one.
DATABASE_METRICS = {
    "pgqueue_jobs_queued": "Jobs in the queue, due now or later.",
    "pgqueue_jobs_runnable": "Queued jobs that are due now.",
    "pgqueue_jobs_running": "Jobs a worker holds under a lease.",
    "pgqueue_jobs_retrying": "Queued jobs that already failed an attempt.",
    "pgqueue_jobs_waiting": (
        "Jobs waiting for other jobs to finish (their depends_on): not claimable until then."
    ),
    "pgqueue_oldest_runnable_age_seconds": "How long the oldest runnable job has been due.",
    "pgqueue_expired_leases": "Running jobs whose lease expired: the next sweep rescues them.",
    "pgqueue_dead_letters": "Dead-lettered jobs kept in the history.",
    "pgqueue_jobs_finished_5m": "Jobs finished in the last 5 minutes: done, failed or cancelled.",
    "pgqueue_queue_paused": "1 while the queue is paused.",
    "pgqueue_workers_alive": (
        "Worker processes seen for the queue in the last 10 minutes: each checks in every "
        "minute and checks out when it stops; one that died counts until 10 minutes after "
        "its last check-in."
    ),
    "pgqueue_lease_rescues_total": "Expired leases the sweeper put back in the queue.",
    "pgqueue_lease_dead_letters_total": "Expired leases the sweeper dead-lettered.",
}
# Handler durations in seconds: from a quick job to the longest timeout worth having.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)


class HandlerDurations:
    """The handler durations of one queue and kind: how many fell in each of DURATION_BUCKETS
    (and over the last), and their sum. Counted here, not with prometheus_client's Histogram,
    whose observe() takes a lock for the sum and for the bucket and walks the buckets in
    Python: once per job, that was a seventh of the worker's own CPU time per job. The worker
    observes and serves its metrics on one thread (its event loop), so plain additions are
    safe; _HandlerDurationsCollector serves them as the histogram Histogram would."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(DURATION_BUCKETS) + 1)  # the last: over every bound (+Inf)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        # a duration equal to a bound counts in that bound's bucket (`le`: less or equal)
        self.counts[bisect.bisect_left(DURATION_BUCKETS, seconds)] += 1
        self.total += seconds

    def cumulative(self) -> list[tuple[str, float]]:
        """The buckets as Prometheus reads them: each bound (`le`) and the count at or below
        it, its bounds written as prometheus_client writes them."""
        bounds = [*map(floatToGoString, DURATION_BUCKETS), "+Inf"]
        return list(zip(bounds, itertools.accumulate(self.counts), strict=True))


@dataclass(frozen=True)
class _Series:
    """The counters and handler durations of one queue and kind."""

    claimed: Counter
    outcomes: dict[Outcome, tuple[Counter, ...]]
    handler_seconds: HandlerDurations


class WorkerMetrics:
    """This worker's counters and handler durations, in a registry of their own; `counts`
    keeps the outcomes by name alone (what /health and the tests read)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.counts: collections.Counter[str] = collections.Counter()
        labels = ("queue", "kind")

        def counter(name: str, documentation: str) -> Counter:
            return Counter(name, documentation, labels, registry=self.registry)

        self._claimed = counter("pgqueue_worker_jobs_claimed", "Jobs this worker claimed.")
        done = counter("pgqueue_worker_jobs_done", "Jobs this worker completed (reported done).")
        failed = counter(
            "pgqueue_worker_jobs_failed",
            "Failed attempts the queue recorded (retried + dead-lettered).",
        )
        retried = counter(
            "pgqueue_worker_jobs_retried",
            "Failed attempts that went back to the queue for another attempt.",
        )
        dead = counter(
            "pgqueue_worker_jobs_dead_lettered",
            "Failed attempts with no attempt left (or not retryable): now dead letters.",
        )
        lost = counter(
            "pgqueue_worker_leases_lost",
            "Jobs whose lease this worker had lost: a heartbeat, completion or failure report "
            "was refused because another attempt owns the job now (rescued, or cancelled).",
        )
        released = counter(
            "pgqueue_worker_jobs_released",
            "Jobs still running at shutdown, handed back to the queue.",
        )
        snoozed = counter(
            "pgqueue_worker_jobs_snoozed",
            "Jobs whose handler asked to run them again later (Snooze), the attempt not counted.",
        )
        self._outcomes: dict[Outcome, tuple[Counter, ...]] = {
            "done": (done,),
            "retried": (retried, failed),
            "dead": (dead, failed),
            "lost": (lost,),
            "released": (released,),
            "snoozed": (snoozed,),
        }
        self._by_kind: dict[tuple[str, str], _Series] = {}
        self.registry.register(_HandlerDurationsCollector(self._by_kind))
        self._wakeups = Counter(
            "pgqueue_worker_wakeups",
            "Times the worker went looking for jobs, by what sent it: notify (a NOTIFY), "
            "http (a POST /wake) or poll (its own timer).",
            ("source",),
            registry=self.registry,
        )

    def expect(self, queue: str, kinds: Iterable[str]) -> None:
        """Show every series of these kinds from the start, at 0: a rate() then counts the
        first job too, and a dashboard has a line for each kind."""
        for kind in kinds:
            self._series(queue, kind)
        for source in WAKEUP_SOURCES:
            self._wakeups.labels(source)

    def claimed(self, jobs: Iterable[Job]) -> None:
        """Count the jobs of one claim."""
        for (queue, kind), n in _tally(jobs).items():
            self._series(queue, kind).claimed.inc(n)

    def finished(self, jobs: Iterable[Job], outcome: Outcome) -> None:
        """Count what the queue recorded of these jobs' attempts: all of them had `outcome`
        (a batch of completions is counted in one call)."""
        for (queue, kind), n in _tally(jobs).items():
            self.counts[outcome] += n
            for counter in self._series(queue, kind).outcomes[outcome]:
                counter.inc(n)

    def handler_ran(self, job: Job, seconds: float) -> None:
        self._series(job.queue, job.kind).handler_seconds.observe(seconds)

    def _series(self, queue: str, kind: str) -> _Series:
        """The series of one queue and kind, looked up once: labels() costs more than the
        increment itself, and a busy worker counts several times per job."""
        series = self._by_kind.get((queue, kind))
        if series is None:
            series = self._by_kind[queue, kind] = _Series(
                claimed=self._claimed.labels(queue, kind),
                outcomes={
                    outcome: tuple(counter.labels(queue, kind) for counter in counters)
                    for outcome, counters in self._outcomes.items()
                },
                handler_seconds=HandlerDurations(),
            )
        return series

    def woken(self, source: WakeupSource) -> None:
        self._wakeups.labels(source).inc()


class _HandlerDurationsCollector:
    """Serves each queue and kind's HandlerDurations as the histogram
    `pgqueue_worker_handler_duration_seconds` (`_bucket`, `_count`, `_sum`)."""

    NAME = "pgqueue_worker_handler_duration_seconds"
    DOCUMENTATION = "How long handlers ran, whatever their outcome."

    def __init__(self, by_kind: dict[tuple[str, str], _Series]) -> None:
        self._by_kind = by_kind

    def describe(self) -> Iterator[MetricFamily]:
        yield HistogramMetricFamily(self.NAME, self.DOCUMENTATION, labels=("queue", "kind"))

    def collect(self) -> Iterator[MetricFamily]:
        family = HistogramMetricFamily(self.NAME, self.DOCUMENTATION, labels=("queue", "kind"))
        for (queue, kind), series in self._by_kind.items():
            durations = series.handler_seconds
            family.add_metric([queue, kind], durations.cumulative(), durations.total)
        yield family


def _tally(jobs: Iterable[Job]) -> collections.Counter[tuple[str, str]]:
    """How many of `jobs` each queue and kind has: the counters are incremented once per
    batch and kind, not once per job (an increment takes a lock)."""
    return collections.Counter(map(_QUEUE_AND_KIND, jobs))


# (job.queue, job.kind), read in C: a generator costs a tenth of a microsecond more a job.
_QUEUE_AND_KIND = operator.attrgetter("queue", "kind")
