"""upgrade_probe: records every run in a file per worker process (the upgrade-under-load test,
tests/upgrade/test_upgrade_under_load.py). Written against 0.1.0's registry (JobInfo's id and
attempt), which later releases keep, so a 0.1.0 worker can load it."""

from __future__ import annotations

import asyncio
import json
import os
import time

from pydantic import BaseModel

from ..registry import JobInfo, handler

# One line per run, appended with a single write(): a line is never lost once the handler has
# returned, whatever happens to the process afterwards.
_LOG = os.open(
    os.path.join(os.environ["UPGRADE_PROBE_DIR"], f"{os.getpid()}.jsonl"),
    os.O_WRONLY | os.O_APPEND | os.O_CREAT,
    0o644,
)
_WORKER = os.environ.get("WORKER_NAME", str(os.getpid()))
# How long a run takes (seconds): the job's I/O, say, which sets how fast a worker drains.
_SLEEP = float(os.environ.get("UPGRADE_PROBE_SLEEP", "0"))


class Probe(BaseModel):
    n: int


@handler("upgrade_probe", timeout=30)
async def upgrade_probe(payload: Probe, job: JobInfo) -> None:
    await asyncio.sleep(_SLEEP)
    line = {"job": job.id, "n": payload.n, "attempt": job.attempt, "worker": _WORKER}
    os.write(_LOG, (json.dumps(line | {"t": time.time()}) + "\n").encode())
