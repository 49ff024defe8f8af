"""End to end: the delay a handler or its kind chooses reaches the database. A job whose
handler throws RetryAfter(90) waits 90 s, one of a kind with its own backoff (base 600 s, no
jitter) waits 600 s, and one of a kind without either the database's backoff() (2.5 to 5 s
after a first failure): the Edge Function sends the first two as fail()'s retry_in through
the Data API (here the PostgREST stand-in) and the third without."""

from __future__ import annotations

import shutil
from pathlib import Path

import psycopg
import pytest

from testkit.postgrest import PostgRESTStandIn
from testkit.stack import point_wake_ups

from .deno_worker import FUNCTION, Deno, register_handler, start_edge_worker, stop_edge_worker
from .test_edge_worker import insert_jobs, wait_for_jobs

HANDLERS = """import { z } from "zod";
import { defineHandler, RetryAfter } from "../job.ts";

export const rateLimited = defineHandler(z.object({ seconds: z.number() }), ({ seconds }) => {
  throw new RetryAfter(seconds, "429 from the API");
}, { backoff: { base: 5, jitter: 0 } });

export const slowCurve = defineHandler(z.object({}), () => {
  throw new Error("the upstream API is down");
}, { backoff: { base: 600, factor: 1, jitter: 0 } });

export const plain = defineHandler(z.object({}), () => {
  throw new Error("the upstream API is down");
});
"""


@pytest.fixture(scope="module")
def retry_function(function_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    copy = tmp_path_factory.mktemp("retries") / FUNCTION
    shutil.copytree(function_dir, copy)
    (copy / "handlers" / "retrying.ts").write_text(HANDLERS)
    register_handler(
        copy,
        'import { plain, rateLimited, slowCurve } from "./retrying.ts";',
        "rate_limited: rateLimited, slow_curve: slowCurve, plain",
    )
    return copy


def test_retry_after_then_the_kinds_backoff_then_the_databases(
    deno: Deno, retry_function: Path, postgrest: PostgRESTStandIn, db: psycopg.Connection
) -> None:
    worker = start_edge_worker(deno, retry_function, postgrest, PGQUEUE_LINGER_MS="0")
    try:
        point_wake_ups(db, worker.url, worker.wake_secret)
        limited, curved, plain = insert_jobs(
            db,
            {"kind": "rate_limited", "payload": {"seconds": 90}},
            {"kind": "slow_curve", "payload": {}},
            {"kind": "plain", "payload": {}},
        )
        wait_for_jobs(db, "status = 'queued' and attempts = 1", worker)
        rows = db.execute(
            "select id, extract(epoch from run_after - now())::float8, last_error"
            " from pgqueue.all_jobs order by id"
        ).fetchall()
    finally:
        stop_edge_worker(worker)
    waits = {job_id: wait for job_id, wait, _ in rows}
    errors = {job_id: error for job_id, _, error in rows}
    assert 80 < waits[limited] <= 90, rows
    assert 590 < waits[curved] <= 600, rows
    assert waits[plain] <= 5, rows
    assert errors[limited].startswith("RetryAfter: 429 from the API")
    assert errors[curved].startswith("Error: the upstream API is down")
