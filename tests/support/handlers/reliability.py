"""reliability: job kinds for the template's reliability suite; each execution is logged."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Literal

from pydantic import BaseModel, Field

from ..registry import JobInfo, handler

_LOG = os.open(
    os.path.join(os.environ["RELIABILITY_AUDIT_DIR"], f"{os.getpid()}.jsonl"),
    os.O_WRONLY | os.O_APPEND | os.O_CREAT,
    0o644,
)
_WORKER = os.environ.get("WORKER_NAME", str(os.getpid()))


def record(job: JobInfo, event: str) -> None:
    line = {"job": job.id, "attempt": job.attempt, "kind": job.kind, "event": event}
    line |= {"worker": _WORKER, "t": time.time()}
    os.write(_LOG, (json.dumps(line) + "\n").encode())


async def run(job: JobInfo, fail: int) -> None:
    """Raise on the first `fail` attempts, succeed after."""
    record(job, "start")
    if job.attempt <= fail:
        record(job, "raise")
        raise RuntimeError(f"chaos: attempt {job.attempt} of job {job.id} fails on purpose")
    record(job, "ok")


class Email(BaseModel):
    n: int
    fail: int = 0
    to: str


class Webhook(BaseModel):
    n: int
    fail: int = 0
    url: str


class Report(BaseModel):
    n: int
    fail: int = 0
    rows: list[int]


@handler("soak_email", timeout=30)
async def soak_email(payload: Email, job: JobInfo) -> None:
    await run(job, payload.fail)


@handler("soak_webhook", timeout=30)
async def soak_webhook(payload: Webhook, job: JobInfo) -> None:
    await run(job, payload.fail)


@handler("soak_report", timeout=30)
async def soak_report(payload: Report, job: JobInfo) -> None:
    await run(job, payload.fail)


class Hang(BaseModel):
    how: Literal["await", "thread"]
    hang_attempts: int = 1


@handler("hang", timeout=1)
async def hang(payload: Hang, job: JobInfo) -> None:
    """Hangs far past its 1 s timeout on its first attempts: in the event loop, or in a
    thread the worker can only abandon."""
    record(job, "start")
    if job.attempt <= payload.hang_attempts:
        if payload.how == "await":
            await asyncio.sleep(3600)
        else:
            await asyncio.to_thread(time.sleep, 30)
    record(job, "ok")


class Line(BaseModel):
    sku: str
    qty: int


class Order(BaseModel):
    order_id: int
    note: str = Field("", max_length=1000)
    lines: list[Line] = []


@handler("strict_order", timeout=30)
async def strict_order(payload: Order, job: JobInfo) -> None:
    await run(job, 0)


class Blob(BaseModel):
    data: str


@handler("blob", timeout=30)
async def blob(payload: Blob, job: JobInfo) -> None:
    await run(job, 0)


class Slow(BaseModel):
    seconds: float


@handler("slow", timeout=60)
async def slow(payload: Slow, job: JobInfo) -> None:
    """Takes `seconds`, then succeeds."""
    record(job, "start")
    await asyncio.sleep(payload.seconds)
    record(job, "ok")
