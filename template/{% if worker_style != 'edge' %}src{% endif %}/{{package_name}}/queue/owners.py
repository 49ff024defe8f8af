# Queue client machinery: you should not need to edit this file (handlers live in handlers/).
"""job.owner: who submitted each claimed job from the app, read only where it can be someone.

The claim does not return owners, so the hot path pays nothing for them. Instead the worker
knows the kinds open to signed-in users (the `client_kinds` table), read when it starts and
at each check-in (every 60 s), and after a claim whose batch has jobs of those kinds it reads
those jobs' owners in one call (`job_owners(ids)`). A project that opens no kind makes no
such call.

The window: a kind opened with allow_client_kind() is known to a running worker at its next
check-in, up to a minute later; a job of that kind claimed before then runs with job.owner
None, like a job the service enqueued. So open a kind a minute before the app lets users
submit it (or restart the workers after opening it). A kind closed with
disallow_client_kind() stays known to the workers that saw it open, so the jobs users
submitted before keep their owners; a worker started after it closed gives them None.
"""

from __future__ import annotations

import logging

from .client import Job, QueueClient

log = logging.getLogger(__name__)


class JobOwners:
    """The kinds open to signed-in users, as last read, and the owners of claimed jobs."""

    def __init__(self, queue: QueueClient) -> None:
        self._queue = queue
        # Every kind seen open since the worker started (closing one keeps its jobs' owners).
        self._kinds: set[str] = set()

    @property
    def kinds(self) -> frozenset[str]:
        return frozenset(self._kinds)

    async def refresh(self) -> None:
        """Read the kinds open to signed-in users now; never stops the worker."""
        try:
            kinds = await self._queue.client_kinds()
        except Exception as exc:  # an older database, or an outage the claim will meet too
            log.warning(
                "client kinds unavailable (apply the migrations: supabase migration up): %s",
                exc,
                extra={"event": "worker.client_kinds_failed", "error": str(exc)},
            )
            return
        self._kinds.update(kinds)

    async def of(self, jobs: list[Job]) -> dict[int, str]:
        """The owners of those of `jobs` a signed-in user submitted, in one call, made only
        when some are of a kind open to users; {} when the call fails (the jobs then run with
        owner None: a handler that needs one fails its attempt, and it is retried)."""
        ids = [job.id for job in jobs if job.kind in self._kinds]
        if not ids:
            return {}
        try:
            return await self._queue.job_owners(ids)
        except Exception as exc:
            log.warning(
                "job owners unavailable: %s",
                exc,
                extra={"event": "worker.job_owners_failed", "error": str(exc)},
            )
            return {}
