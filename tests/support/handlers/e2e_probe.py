"""e2e_probe: records each run (and the job's owner) in a file; sleeps, fails (a
UserFacingError too, or a RetryAfter), snoozes, reports progress and returns a result on demand
(template tests)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ..registry import JobInfo, PermanentError, RetryAfter, Snooze, UserFacingError, handler


class Probe(BaseModel):
    log: str
    sleep: float = 0
    sleep_first_attempt_only: bool = False
    error: str | None = None
    # raised as a UserFacingError: the message the job's owner reads in my_jobs
    user_error: str | None = None
    # raised as a PermanentError: its owner reads nothing, whatever its text
    permanent_error: str | None = None
    # raised as RetryAfter(retry_after): the next attempt that many seconds from now
    retry_after: float | None = None
    # its first `fail_attempts` attempts raise ConnectionError
    fail_attempts: int = 0
    # its first `snoozes` runs raise Snooze(snooze_seconds)
    snoozes: int = 0
    snooze_seconds: float = 0.1
    # reported with job.report_progress() before the sleep, when given
    progress: Any = None
    # returned: the job's result
    result: Any = None
    # return NaN, which is not JSON
    nan_result: bool = False


@handler("e2e_probe", timeout=60)
async def e2e_probe(payload: Probe, job: JobInfo) -> Any:
    def record(at: str, **fields: object) -> None:
        line = {"job_id": job.id, "attempt": job.attempt, "at": at, "t": time.time(), **fields}
        with Path(payload.log).open("a") as f:
            f.write(json.dumps(line) + "\n")

    runs_before = sum(
        1 for line in _lines(payload.log) if line["job_id"] == job.id and line["at"] == "start"
    )
    record("start", owner=job.owner)
    if runs_before < payload.snoozes:
        raise Snooze(payload.snooze_seconds)
    if job.attempt <= payload.fail_attempts:
        raise ConnectionError(f"attempt {job.attempt}: the upstream refused the connection")
    if payload.progress is not None:
        record("progress", reported=await job.report_progress(payload.progress))
    if payload.sleep and (job.attempt == 1 or not payload.sleep_first_attempt_only):
        await asyncio.sleep(payload.sleep)
    if payload.retry_after is not None:
        raise RetryAfter(payload.retry_after, "the API said: retry later")
    if payload.error:
        raise RuntimeError(payload.error)
    if payload.user_error:
        raise UserFacingError(payload.user_error)
    if payload.permanent_error:
        raise PermanentError(payload.permanent_error)
    record("end")
    return float("nan") if payload.nan_result else payload.result


def _lines(log: str) -> list[dict[str, Any]]:
    path = Path(log)
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
