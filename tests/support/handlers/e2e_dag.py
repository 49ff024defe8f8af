"""e2e_dag: a node of the random workflows (tests/worker/test_worker_workflow_property.py,
template tests). Records each attempt in a file (its worker's pid, its start and its end or
failure, with what job.dependencies handed it); raises on its first `fail_attempts`
attempts (retried after a tenth of a second, or dead-lettered once out of attempts); sleeps on
its first attempt when asked (so that a worker can be killed while it runs); returns its node's
name."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ..registry import Backoff, JobInfo, handler


class Node(BaseModel):
    log: str
    name: str
    # its first `fail_attempts` attempts raise
    fail_attempts: int = 0
    # seconds its first attempt sleeps before it ends
    sleep_first: float = 0


@handler("e2e_dag", timeout=60, backoff=Backoff(base=0.1, factor=1, cap=0.1, jitter=0))
async def e2e_dag(payload: Node, job: JobInfo) -> str:
    def record(at: str, **fields: Any) -> None:
        line = {
            "job_id": job.id,
            "name": payload.name,
            "attempt": job.attempt,
            "pid": os.getpid(),
            "at": at,
            "t": time.time(),
            **fields,
        }
        # one short append per line: whole lines, whichever process writes
        with Path(payload.log).open("a") as f:
            f.write(json.dumps(line) + "\n")

    record("start")
    if job.attempt == 1 and payload.sleep_first:
        await asyncio.sleep(payload.sleep_first)
    received = {
        str(d.id): {"status": d.status, "result": d.result, "error": d.error}
        for d in job.dependencies.values()
    }
    if job.attempt <= payload.fail_attempts:
        record("fail", dependencies=received)
        raise RuntimeError(f"node {payload.name} failed on attempt {job.attempt}")
    record("end", dependencies=received)
    return payload.name
