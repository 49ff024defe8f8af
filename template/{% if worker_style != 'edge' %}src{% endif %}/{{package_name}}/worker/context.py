# Worker machinery: you should not need to edit this file (handlers live in handlers/).
"""What every part of a running worker shares, built once when it starts and passed whole.

The worker builds its context when its first run() or drain() starts, once the database has
answered (loop.py): the lease length is read then, once, from WORKER_LEASE_SECONDS or else the
database's configuration (`<schema>.configure()`), with the largest result the database
stores. The job runner, the lease keeper, the completions and the failure reports read them
from here. None of them sends the lease back: a claim or a heartbeat names a lease only when
WORKER_LEASE_SECONDS sets one, and otherwise the database applies its own, the one read here
(restart the workers after `config set lease_seconds=...`, so that their renewals keep pace).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..queue import QueueClient
from ..registry import Registry
from ..settings import Settings
from .backoff import Outage
from .metrics import WorkerMetrics
from .tracing import JobTracing


@dataclass(frozen=True, slots=True)
class WorkerContext:
    settings: Settings
    queue: QueueClient
    # The handlers this worker runs, by kind: it claims only their kinds.
    handlers: Registry
    # What it counted (metrics.py), whether or not METRICS_PORT serves it.
    metrics: WorkerMetrics
    # Shared by every call that waits out an outage: one that gets through ends the others'
    # pauses, so the successes waiting to be reported go with the first claim that works.
    outage: Outage
    # Spans for handler runs when WORKER_TRACING=on (tracing.py), else None.
    tracing: JobTracing | None
    # The lease its jobs are held under, in seconds: renewed at half of it.
    lease_seconds: int
    # The largest result the database stores (max_result_bytes), checked before it goes.
    max_result_bytes: int
