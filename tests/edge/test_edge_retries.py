"""End to end: the delay a handler or its kind chooses reaches the database. A job whose
handler throws RetryAfter(90) waits 90 s, one of a kind with its own backoff (base 600 s, no
jitter) waits 600 s, and one of a kind without either the database's backoff() (2.5 to 5 s
after a first failure): the Edge Function sends the first two as fail()'s retry_in through
the Data API (here the PostgREST stand-in) and the third without. A job that fails twice lists
both errors in job(id), with their type and worker; a handler that throws Snooze three times
runs four times on one attempt."""

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
import { defineHandler, RetryAfter, Snooze } from "../job.ts";

// runs of each job in this isolate (the tests run one isolate)
const runs = new Map<number, number>();

export const flaky = defineHandler(z.object({}), (_payload, { job }) => {
  if (job.attempt <= 2) throw new TypeError(`attempt ${job.attempt}: the upstream refused`);
  return { attempt: job.attempt };
}, { backoff: { base: 0.2, factor: 1, jitter: 0 } });

export const snoozing = defineHandler(z.object({}), (_payload, { job }) => {
  const n = (runs.get(job.id) ?? 0) + 1;
  runs.set(job.id, n);
  if (n <= 3) throw new Snooze(0.2);
  return { runs: n, attempt: job.attempt };
});

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
        'import { flaky, plain, rateLimited, slowCurve, snoozing } from "./retrying.ts";',
        "rate_limited: rateLimited, slow_curve: slowCurve, plain, flaky, snoozing",
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


def test_every_failed_attempts_error_is_kept_and_a_snooze_spends_no_attempt(
    deno: Deno, retry_function: Path, postgrest: PostgRESTStandIn, db: psycopg.Connection
) -> None:
    worker = start_edge_worker(deno, retry_function, postgrest, PGQUEUE_LINGER_MS="10000")
    try:
        point_wake_ups(db, worker.url, worker.wake_secret)
        flaky, snoozing = insert_jobs(
            db,
            {"kind": "flaky", "payload": {}},
            {"kind": "snoozing", "payload": {}, "max_attempts": 1},
        )
        wait_for_jobs(db, "status = 'done'", worker)
    finally:
        stop_edge_worker(worker)
    rows = db.execute(
        "select id, attempts, result, errors, snoozes from pgqueue.job(%s)"
        " union all select id, attempts, result, errors, snoozes from pgqueue.job(%s)",
        (flaky, snoozing),
    ).fetchall()
    (_, attempts, result, errors, snoozes), snoozed = rows
    assert (attempts, result, snoozes) == (3, {"attempt": 3}, 0)
    assert [(e["attempt"], e["type"]) for e in errors] == [(1, "TypeError"), (2, "TypeError")]
    assert errors[0]["message"].startswith("TypeError: attempt 1: the upstream refused")
    assert errors[0]["worker"] and errors[0]["worker"] == errors[1]["worker"]
    # four runs, each on attempt 1 (max_attempts 1: a counted retry would dead-letter it)
    assert snoozed[1:] == (1, {"runs": 4, "attempt": 1}, [], 3)
