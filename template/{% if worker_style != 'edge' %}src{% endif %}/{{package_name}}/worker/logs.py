# Worker machinery: you should not need to edit this file.
"""Structured logs: one JSON object per line, so a log service can filter on job_id or kind.
Fields come from `extra`, e.g.
`log.info("job done", extra={"event": "job.done", "job_id": 42, "duration_ms": 12.5})`.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import traceback
from datetime import UTC, datetime
from typing import Any

from ..queue import Job

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD = {*vars(logging.makeLogRecord({})), "message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update((k, v) for k, v in vars(record).items() if k not in _STANDARD)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure(level: str = "INFO") -> None:
    """Send every log record to stderr as one JSON line."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # httpx logs every request at INFO: too chatty for a worker that polls.
    logging.getLogger("httpx").setLevel(logging.WARNING)


def job_fields(job: Job) -> dict[str, Any]:
    """What every log line about a job carries."""
    return {"job_id": job.id, "kind": job.kind, "attempt": job.attempts, "queue": job.queue}


def ms_since(started: float) -> float:
    """Milliseconds since `started` (a time.monotonic() reading), for `duration_ms`."""
    return round((time.monotonic() - started) * 1000, 1)


def describe_exception(exc: BaseException) -> str:
    """`TypeName: message`, or the type's name alone when the message is empty."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


# How much of a failed handler's traceback a job keeps (its last_error) and its log line shows:
# the end, where it went wrong.
TRACEBACK_CHARS = 4_000


def describe_failure(exc: BaseException) -> str:
    """describe_exception() on the first line, then the traceback's last TRACEBACK_CHARS
    characters: what a handler's unexpected error leaves in the log and in the job."""
    trace = "".join(traceback.format_exception(exc)).rstrip()
    if len(trace) > TRACEBACK_CHARS:
        trace = "..." + trace[-TRACEBACK_CHARS:]
    return f"{describe_exception(exc)}\n{trace}"
