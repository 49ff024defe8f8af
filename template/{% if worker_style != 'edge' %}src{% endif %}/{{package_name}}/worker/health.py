# Worker machinery: you should not need to edit this file (handlers live in handlers/).
"""The queue's health (`health()`) as this project reads it. The database checks everything
wake-ups and rescues may depend on; what this project's worker does not use
(settings.UNUSED_HEALTH: a worker that LISTENs or polls gets no HTTP wake-up) is reported ok,
saying why, so neither the worker's start-up, `stats` nor `health` warns about it."""

from __future__ import annotations

import logging

from ..queue import QueueClient
from ..queue.functions import Row
from ..settings import UNUSED_BECAUSE, UNUSED_HEALTH

log = logging.getLogger(__name__)


async def project_health(queue: QueueClient) -> list[Row]:
    """health()'s rows, those this project does not use marked ok with the reason."""
    return [
        {**row, "ok": True, "detail": f"not needed: {UNUSED_BECAUSE} ({row['detail']})"}
        if row["component"] in UNUSED_HEALTH
        else row
        for row in await queue.health()
    ]


async def log_health(queue: QueueClient) -> None:
    """Log a warning for each thing that stops wake-ups or rescues (project_health()), once at
    start: a project never loses its wake-ups silently."""
    try:
        rows = await project_health(queue)
    except Exception as exc:  # an older database, or none yet: the worker runs all the same
        log.warning(
            "health check unavailable (apply the migrations: supabase migration up): %s",
            exc,
            extra={"event": "worker.health_unavailable", "error": str(exc)},
        )
        return
    for row in rows:
        if not row["ok"]:
            log.warning(
                "%s: %s",
                row["component"],
                row["detail"],
                extra={"event": "worker.health", "component": row["component"]},
            )
