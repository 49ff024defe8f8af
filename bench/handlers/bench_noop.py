"""noop: a job that does nothing, for the template's benchmark (bench/run adds this file)."""

from __future__ import annotations

import os
import time

from pydantic import BaseModel

from ..registry import JobInfo, handler

_STARTS = os.environ.get("BENCH_HANDLER_STARTS")


class NoopPayload(BaseModel):
    n: int = 0


@handler("noop")
async def noop(payload: NoopPayload, job: JobInfo) -> None:
    if _STARTS:  # the latency scenario: when did this job's handler start?
        with open(_STARTS, "a") as f:
            f.write(f"{job.id} {time.time()}\n")
