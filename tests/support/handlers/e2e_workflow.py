"""e2e_step: a step of the workflow tests (template tests). Records each run in a file, with
what its dependencies ended as (job.dependencies); fails for good unless a file exists, when
asked; returns its name and its done dependencies' names (typed by the Kind STEP), padded
to a size on demand."""

from __future__ import annotations

import json
import time
from pathlib import Path

from pydantic import BaseModel

from ..dependencies import Kind
from ..registry import JobInfo, PermanentError, handler


class Step(BaseModel):
    log: str
    name: str
    # fail (PermanentError) while this file does not exist
    fail_unless: str | None = None
    # the result carries this many bytes more
    pad: int = 0


class StepResult(BaseModel):
    name: str
    after: list[str]
    pad: str = ""


STEP = Kind("e2e_step", Step, StepResult)


@handler("e2e_step", timeout=60)
async def e2e_step(payload: Step, job: JobInfo) -> StepResult:
    def record(at: str, **fields: object) -> None:
        line = {"job_id": job.id, "name": payload.name, "at": at, "t": time.time(), **fields}
        with Path(payload.log).open("a") as f:
            f.write(json.dumps(line) + "\n")

    record("start")
    if payload.fail_unless is not None and not Path(payload.fail_unless).exists():
        raise PermanentError(f"step {payload.name} failed")
    after = [result.name for result in job.dependencies.results(STEP)]
    dependencies = {
        str(d.id): {"kind": d.kind, "status": d.status, "error": d.error}
        for d in job.dependencies.values()
    }
    record(
        "end",
        after=after,
        dependencies=dependencies,
        omitted=job.dependencies.results_omitted,
        payload_keys=sorted(payload.model_dump()),
    )
    return StepResult(name=payload.name, after=after, pad="x" * payload.pad)
