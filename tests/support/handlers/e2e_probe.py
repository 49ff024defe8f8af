"""e2e_probe: records each run in a file; sleeps and fails on demand (template tests)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from pydantic import BaseModel

from ..registry import JobInfo, handler


class Probe(BaseModel):
    log: str
    sleep: float = 0
    sleep_first_attempt_only: bool = False
    error: str | None = None


@handler("e2e_probe", timeout=60)
async def e2e_probe(payload: Probe, job: JobInfo) -> None:
    def record(at: str) -> None:
        with Path(payload.log).open("a") as f:
            f.write(json.dumps({"job_id": job.id, "attempt": job.attempt, "at": at}) + "\n")

    record("start")
    if payload.sleep and (job.attempt == 1 or not payload.sleep_first_attempt_only):
        await asyncio.sleep(payload.sleep)
    if payload.error:
        raise RuntimeError(payload.error)
    record("end")
