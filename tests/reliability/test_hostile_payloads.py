"""Payloads a worker should never trust: huge (just under the 1 MiB limit enqueue enforces),
deeply nested, not an object, the wrong types for the handler's model. Each bad job fails
at once with a stored error that says what was wrong; the worker keeps serving. (A payload
too deep for Python's json module: tests/worker/test_worker_end_to_end.py, every variant.)"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import psycopg

from testkit.cluster import Cluster
from tests.support.jobs import job

from .conftest import PYTHON, Fleet
from .harness import audit, figures, wait_drained

LIMIT = 1_048_576  # enqueue's limit on pg_column_size(payload)
DEPTH = 500  # deep, yet within what Python's json module decodes (about 990 levels)


def incompressible(size: int) -> str:
    """Random text: jsonb cannot compress it, so its stored size is its length."""
    return base64.b64encode(os.urandom(size))[:size].decode()


def enqueue_raw(db: psycopg.Connection, kind: str, payload_json: str) -> int:
    row = db.execute(
        "select pgqueue.enqueue(%s, %s::jsonb, max_attempts => 3)", (kind, payload_json)
    ).fetchone()
    assert row is not None
    return row[0]


def test_hostile_payloads_fail_clearly_and_the_worker_goes_on(
    db: psycopg.Connection, stack: Cluster, fleet: Fleet, audit_dir: Path
) -> None:
    huge = incompressible(LIMIT - 4096)
    nested = "[" * DEPTH + "]" * DEPTH
    bad = {
        "huge, field over its max_length": (
            json.dumps({"order_id": 1, "note": huge}),
            "note: String should have at most 1000 characters",
        ),
        "deeply nested": (
            f'{{"order_id": 2, "lines": {nested}}}',
            "lines.0: Input should be a valid dictionary",  # the first level it rejects
        ),
        "a JSON array": ("[1, 2, 3]", "payload: Input should be a valid dictionary"),
        "a JSON string": ('"drop table pgqueue.jobs"', "payload: Input should be a valid"),
        "a JSON number": ("42", "payload: Input should be a valid dictionary"),
        "JSON null": ("null", "payload: Input should be a valid dictionary"),
        "wrong types": (
            json.dumps({"order_id": "one", "lines": [{"sku": 7, "qty": "many"}]}),
            "order_id: Input should be a valid integer",
        ),
    }
    ids = {name: enqueue_raw(db, "strict_order", payload) for name, (payload, _) in bad.items()}
    size = db.execute(
        "select pg_column_size(payload) from pgqueue.all_jobs where id = %s",
        (ids["huge, field over its max_length"],),
    ).fetchone()
    assert size is not None and LIMIT - 8192 < size[0] <= LIMIT  # just under the limit
    huge_ok = enqueue_raw(db, "blob", json.dumps({"data": huge}))
    fine = [enqueue_raw(db, "strict_order", json.dumps({"order_id": n})) for n in range(200)]

    worker = fleet(PYTHON).start(ready=False, WORKER_NAME="h0")
    drained = wait_drained(stack.dsn(), timeout=60)

    errors = {}
    for name, job_id in ids.items():
        row = job(db, job_id)
        errors[name] = row["last_error"]
        assert (row["status"], row["attempts"]) == ("failed", 1), (name, row["last_error"])
        assert row["last_error"].startswith("invalid payload for 'strict_order': "), name
        assert bad[name][1] in row["last_error"], (name, row["last_error"])
        assert len(row["last_error"]) <= 10_000
    assert job(db, huge_ok)["status"] == "done"
    assert {job(db, i)["status"] for i in fine} == {"done"}
    assert worker.proc.poll() is None, worker.output()

    all_ids = [*ids.values(), huge_ok, *fine]
    result = audit(db, all_ids, audit_dir)
    figures(
        "hostile payloads",
        jobs=result.jobs,
        hostile=len(bad),
        failed_with_clear_error=len(errors),
        huge_payload_bytes=size[0],
        nesting_depth=DEPTH,
        drain_s=drained,
        done=result.done,
        lost=result.lost,
    )
    for name, error in errors.items():
        print(f"    {name}: {error[:160]}")
    result.check()
